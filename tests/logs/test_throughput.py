"""Throughput as trainers print it, never a neighbouring number, and drops of a worker, of the total, of short logs."""
from __future__ import annotations

import pytest

from dflash_doctor.logs.throughput import rate, step
from tests.conftest import REPO
from tests.logs.test_scan import scan_text


@pytest.mark.parametrize("line, expected", [
    ("[drafter-0] step=12 loss=2.1 7.1 Ktok/s", (7100.0, "tok/s")),
    ("21500 tokens/s", (21500.0, "tok/s")),
    # torchtitan: the value after the key, with a thousands separator
    ("[rank0]:[titan] 2026-11-29 09:00:01,100 - root - INFO - step: 10  loss:  7.8512  memory: 37.22GiB(39.16%)  "
     "tps: 5,856  tflops: 339.14  mfu: 34.29%", (5856.0, "tok/s")),
    ("step: 3  wps: 4,101  mfu: 30%", (4101.0, "tok/s")),
    # the loss next to it is not the throughput, on either side
    ("loss=2.1 tokens/s=9800", (9800.0, "tok/s")),
    ("tokens/s=9800 loss=2.1", (9800.0, "tok/s")),
    ("loss=2.1 tok/s", None),
    ("thread=worker-3 step=5 tput=12.5 Ktokens/s", (12500.0, "tok/s")),
    ("throughput: 1,234 tokens/sec", (1234.0, "tok/s")),
    ("tokens/sec/gpu: 3200", (3200.0, "tok/s")),
    ("12.5 samples/sec", (12.5, "samples/s")),
    ("{'train_samples_per_second': 12.34, 'epoch': 1.0}", (12.34, "samples/s")),
    # tqdm, both directions, and Megatron's iteration time
    ("100%|##########| 50/50 [00:10<00:00, 4.95it/s]", (4.95, "it/s")),
    (" 12%|#         | 6/50 [00:10<01:00, 2.00s/it]", (0.5, "it/s")),
    (" iteration      100/  500000 | elapsed time per iteration (ms): 800.0 | lr: 1e-4", (1.25, "it/s")),
    ("tok/s", None),
    ("saved 7 checkpoints to /data/tok/s3", None),
])
def test_rate_forms(line, expected):
    if expected is None:
        assert rate(line) is None
    else:
        assert rate(line) == (pytest.approx(expected[0]), expected[1])


@pytest.mark.parametrize("line, expected", [
    ("step: 10  loss: 7.8", 10), ("[titan] step:  4  loss:", 4), (" iteration      100/  500000 |", 100),
    ("global_step=7 Step: 9", 9), ("steps=3", None),
])
def test_step_forms(line, expected):
    assert step(line) == expected


def test_total_across_threads_drops_when_a_thread_dies_in_a_short_log():
    # Three drafters at 7.1 K each, drafter-0 dies after four steps: no worker's own series dropped, and there are
    # too few rounds for the rolling window; the total falls from 21.5 K to 14.2 K to the end of the log.
    report = scan_text((REPO / "fixtures" / "logs" / "short_drop.log").read_text())
    drop = next(f for f in report.findings if f.code == "DFD503")
    assert (drop.evidence["thread"], drop.evidence["from"], drop.evidence["to"]) == ("total", 21450.0, 14200.0)
    assert drop.evidence["at_end"] and drop.line == 18  # the first round without drafter-0
    assert [f.code for f in report.findings].count("DFD503") == 1


def test_total_is_not_summed_when_the_log_prints_its_own_total():
    lines = []
    for n in range(1, 30):
        lines += [f"[drafter-{t}] step={n} 7.1 Ktok/s" for t in range(3 if n < 15 else 2)]
        lines.append(f"pipeline step={n} total {21.3 if n < 15 else 14.2} Ktok/s")
    report = scan_text("\n".join(lines) + "\n")
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD503", "main")]


def test_a_long_healthy_log_with_noise_has_no_drop():
    lines = [f"[rank{r}] step={n} {7000 + (n * 37 + r * 11) % 600} tok/s" for n in range(300) for r in range(4)]
    assert scan_text("\n".join(lines) + "\n").findings == []


def test_one_low_sample_at_the_end_is_not_a_drop():
    text = "".join(f"step={n} 100 tok/s\n" for n in range(1, 6)) + "step=6 20 tok/s\n"
    assert scan_text(text).findings == []
    assert [f.code for f in scan_text(text + "step=7 20 tok/s\n").findings] == ["DFD503"]


def test_it_per_s_reads_as_tokens_with_a_known_batch():
    text = "".join(f"[rank0] step={n} 4.0it/s\n" for n in range(1, 5))
    report = scan_text(text, tokens_per_it=2048)
    assert report.facts["threads"]["rank0"]["last_tok_s"] == 8192.0
    assert scan_text(text).facts["threads"]["rank0"]["rate_unit"] == "it/s"
