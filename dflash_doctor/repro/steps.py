"""The step each worker thread repeats: the reference drafter's training step, or the user's own code.

`--model pkg.module:factory` imports and runs user code: `factory()` returns `(module, input_builder)`, where
`input_builder(device, shape_index)` returns the positional arguments (a tuple) or keyword arguments (a dict)
for one forward. The harness moves the module to the thread's device, wraps it in `torch.compile` (after the
mitigations are installed; `--model-compile yours` leaves the module as it is, for a model that compiles an
inner function itself), and with backward on sums the first tensor output and calls backward.

`--step pkg.module:make_step` replays a trainer's step exactly as written: `make_step(device, shape_index)`
(called in the worker's process after the mitigations are installed) returns a zero-argument callable that runs
one whole training step, compiling, running forward and backward the way the trainer does; what it returns is
only recorded (a tensor or number is kept as the step's loss).
"""
from __future__ import annotations

import importlib
from typing import Callable, List

from dflash_doctor.errors import UsageError
from dflash_doctor.repro.spec import PhaseSpec
from dflash_doctor.vocabularies import ModelCompile


def load_factory(model: str, option: str = "--model") -> Callable:
    module_name, _, attribute = model.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{option} {model}: cannot import {module_name} ({exc})") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: their error, one line
        raise UsageError(f"{option} {model}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UsageError(f"{option} {model}: {module_name} has no callable {attribute}")
    return factory


def _first_tensor(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def user_model_step(factory: Callable, device: str, shape_index: int, backward: bool,
                    compile_whole: bool = True) -> Callable[[], float]:
    import torch

    try:
        built = factory()
    except Exception as exc:  # noqa: BLE001 - the user's factory raised: their error, one line
        raise UsageError(f"the --model factory raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(built, tuple) and len(built) == 2 and callable(built[1])):
        raise UsageError("the --model factory must return (module, input_builder)")
    module, input_builder = built
    module = module.to(device)
    # A trainer that compiles an inner function (flex_attention, a block) would be replayed as a different
    # program under a whole-module wrapper: `yours` keeps the user's own compile boundaries.
    compiled = torch.compile(module) if compile_whole else module
    dev = torch.device(device)

    def step() -> float:
        inputs = input_builder(dev, shape_index)
        with torch.set_grad_enabled(backward):
            out = compiled(**inputs) if isinstance(inputs, dict) else compiled(*inputs)
            tensor = _first_tensor(out)
            if tensor is None:
                raise TypeError("the --model forward returned no tensor")
            loss = tensor.float().sum()
            if backward:
                loss.backward()
        return float(loss.detach())

    return step


def user_step(make_step: Callable, device: str, shape_index: int) -> Callable[[], float]:
    import torch

    try:
        step = make_step(torch.device(device), shape_index)
    except Exception as exc:  # noqa: BLE001 - the user's make_step raised: their error, one line
        raise UsageError(f"the --step function raised {type(exc).__name__}: {exc}") from exc
    if not callable(step):
        raise UsageError("the --step function must return a zero-argument callable (one training step)")

    def run() -> float:
        result = step()
        tensor = _first_tensor(result)
        if tensor is not None:
            return float(tensor.detach().float().sum())
        return float(result) if isinstance(result, (int, float)) else 0.0

    return run


def build_thread_steps(spec: PhaseSpec) -> List[Callable[[], float]]:
    """One zero-argument step per worker thread, on its device and with its shape index."""
    steps = []
    factory = load_factory(spec.model, "--model") if spec.model else None
    make_step = load_factory(spec.step, "--step") if spec.step else None
    for index in range(spec.threads):
        device = spec.devices[index % len(spec.devices)]
        shape_index = spec.shape_indices[index]
        if make_step is not None:
            steps.append(user_step(make_step, device, shape_index))
        elif factory is not None:
            steps.append(user_model_step(factory, device, shape_index, spec.backward,
                                         compile_whole=spec.model_compile == ModelCompile.WHOLE.value))
        else:
            from dflash_doctor.reference.replay import build_drafter_step

            drafter = build_drafter_step(preset=spec.preset, device=device, checkpoint=spec.checkpoint,
                                         shape_index=shape_index, backward=spec.backward, seed=index)
            steps.append(drafter.run)
    return steps
