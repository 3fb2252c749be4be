"""A small inference server: a compiled classifier, and a pool of request threads that all start at once and each
make their first call of it (the shape of pytorch/pytorch#123177). Nothing is warmed up first. Prints how many
requests were answered; exit 0."""
import threading

import torch

torch.manual_seed(0)
classifier = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
opened = threading.Barrier(32)
answers = []


def serve(request_id):
    features = torch.randn(8, 16)
    opened.wait()
    with torch.no_grad():
        answers.append(classifier(features).argmax(dim=1))


handlers = [threading.Thread(target=serve, args=(i,), name=f"request-{i}") for i in range(32)]
for handler in handlers:
    handler.start()
for handler in handlers:
    handler.join()
print(f"answered {len(answers)} requests", flush=True)
