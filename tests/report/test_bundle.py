"""The bug-report bundle: every section present, failures become Problems, planted secrets never survive."""
from __future__ import annotations

import datetime as dt
import json
import re
from html.parser import HTMLParser

import pytest

from dflash_doctor.errors import MissingDependency, UsageError
from dflash_doctor.findings import Report
from dflash_doctor.report import BundleSources, build_bundle, render_html, render_markdown, save_last_repro
from dflash_doctor.report.gpu_snapshot import gpu_snapshot
from dflash_doctor.report.last_repro import last_repro_path
from dflash_doctor.report.redact import REDACTED
from dflash_doctor.rules import lookup
from tests.conftest import run_cli
from tests.report.test_redact import AWS_ID, GITHUB, HF, OPENAI

PASSWORD = "Tr0ub4dor-and-3"
PLANTED = (HF, GITHUB, OPENAI, AWS_ID, PASSWORD, "alice:" + PASSWORD)


def _planted_env(cache) -> dict:
    return {
        "HF_TOKEN": HF,
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "TORCH_LOGS": "recompiles",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_me",
        "NCCL_DEBUG_FILE": f"/logs/{GITHUB}/nccl.txt",
        "HF_ENDPOINT": f"https://alice:{PASSWORD}@hub.example.com",
        "AWS_ACCESS_KEY_ID": AWS_ID,  # not a prefix of interest: not even listed
        "DFLASH_DOCTOR_CACHE": str(cache),
    }


def _sources(env, **overrides) -> BundleSources:
    fixes = [{"fix": "Warm up in one thread.", "cost": "a serial warm-up"}]
    guards = Report("guards", findings=[], facts={"verdict": "vulnerable", "torch": "2.13.0", "note": f"key={OPENAI}",
                                                  "fixes": fixes})
    scan = Report("scan", findings=[lookup("DFD101").finding(path=f"/home/{GITHUB}/train.py", line=4, column=9)],
                  facts={"files": 1})
    defaults = dict(
        guards=lambda: guards,
        scan=lambda: scan,
        gpus=lambda: {"gpus": [{"index": 0, "name": "H200", "utilization %": 100.0}], "reason": "", "findings": []},
        env=env,
        version_of=lambda name: {"torch": "2.13.0+cpu"}.get(name) or (_ for _ in ()).throw(LookupError(name)),
        now=lambda: dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc),
        host=lambda: "laptop",
        cwd=lambda: "/home/me/project",
        argv=["dflash-doctor", "report", "src"],
    )
    defaults.update(overrides)
    return BundleSources(**defaults)


MADE = {"command": "dflash-doctor repro --threads 3 --device cuda", "host": "h200-box", "cwd": "/work/trainer",
        "started_at": "2026-11-29T09:55:00+00:00", "finished_at": "2026-11-29T10:00:00+00:00"}


def _repro_envelope(made=MADE) -> dict:
    facts = {"stderr_tail": f"export HF_TOKEN={HF}\npassword: {PASSWORD}", "verdict": "reproduced"}
    if made is not None:
        facts["made"] = made
    return {"tool": "dflash-doctor", "command": "repro", "exit_code": 1,
            "findings": [{"code": "DFD701", "severity": "error", "path": None, "line": None,
                          "message": "reproduced"}],
            "facts": facts}


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.open = []
        self.headings = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        if tag not in ("meta",):
            self.open.append(tag)
        self._in_heading = tag in ("h1", "h2")

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (self.open, tag)
        self.open.pop()
        self._in_heading = False

    def handle_data(self, data):
        if self._in_heading:
            self.headings.append(data)


def test_bundle_has_every_section_and_no_planted_secret(tmp_path):
    env = _planted_env(tmp_path)
    save_last_repro(_repro_envelope(), env)
    bundle = build_bundle(["src"], sources=_sources(env))
    assert bundle.problems == []
    assert bundle.guards["verdict"] == "vulnerable"
    assert bundle.scan["counts"] == {"DFD101": 1} and bundle.scan["paths"] == ["src"]
    assert bundle.repro["source"] == str(last_repro_path(env)) and bundle.repro["result"]["exit_code"] == 1
    assert bundle.environment["packages"]["torch"] == "2.13.0+cpu"
    assert bundle.environment["packages"]["transformers"] is None
    assert bundle.environment["env"]["HF_TOKEN"] == REDACTED
    assert bundle.environment["env"]["WANDB_API_KEY"] == REDACTED
    assert bundle.environment["env"]["TORCH_LOGS"] == "recompiles"
    assert "AWS_ACCESS_KEY_ID" not in bundle.environment["env"]

    markdown = render_markdown(bundle)
    page = render_html(bundle)
    for document in (markdown, page):
        for secret in PLANTED:
            assert secret not in document
        assert "TORCH_LOGS=recompiles" in document
        assert "TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_me" in document
        assert "hub.example.com" in document
    assert "| Warm up in one thread. | a serial warm-up |" in markdown.splitlines()
    assert re.findall(r"^## (.+)$", markdown, flags=re.MULTILINE) == [
        "Environment", "Guards", "Scan", "GPU snapshot", "Last repro"]
    parser = _Html()
    parser.feed(page)
    assert parser.open == []  # every tag closed
    assert parser.headings == ["dflash-doctor report", "Environment", "Guards", "Scan", "GPU snapshot", "Last repro"]


def test_failing_sources_become_problems_and_the_rest_is_still_written(tmp_path):
    env = _planted_env(tmp_path)

    def no_torch():
        raise MissingDependency("guards needs torch, which is not importable here")

    def broken():
        raise RuntimeError(f"boom with {HF}")

    bundle = build_bundle(sources=_sources(env, guards=no_torch, gpus=broken))
    assert [(p.subject, p.reason) for p in bundle.problems] == [
        ("guards", "guards needs torch, which is not importable here"),
        ("gpus", f"RuntimeError: boom with {HF}"),
    ]
    assert bundle.guards is None and bundle.gpus is None and bundle.scan is not None
    assert bundle.repro == {"source": str(last_repro_path(env)), "result": None}
    markdown = render_markdown(bundle)
    assert HF not in markdown
    assert "## Problems" in markdown and "Could not check guards: guards needs torch" in markdown


def test_each_result_says_where_when_and_by_which_command_it_was_made(tmp_path):
    env = _planted_env(tmp_path)
    save_last_repro(_repro_envelope(), env)
    bundle = build_bundle(["src"], sources=_sources(env))
    assert bundle.repro["made"] == MADE and bundle.repro["age_s"] == 2 * 3600
    lines = render_markdown(bundle).splitlines()
    here = "Made by `dflash-doctor report src` on laptop in /home/me/project, at 2026-11-29T12:00:00+00:00, by this report."
    # guards, scan and the GPU snapshot were made now, by the report itself; each section says so
    assert lines.count(here) == 3
    section = lines[lines.index("## Last repro"):]
    assert ("Made by `dflash-doctor repro --threads 3 --device cuda` on h200-box in /work/trainer, finished "
            "2026-11-29T10:00:00+00:00 (2 hours before this report).") in section
    assert f"Read from {last_repro_path(env)}: exit code 1" in section


@pytest.mark.parametrize("made", [None, {"command": "dflash-doctor repro", "host": "x", "cwd": "/"},
                                  dict(MADE, finished_at="yesterday"), dict(MADE, finished_at="2026-11-29T10:00:00")])
def test_a_result_that_cannot_be_dated_is_left_out_and_said_so(tmp_path, made):
    env = _planted_env(tmp_path)
    save_last_repro(_repro_envelope(made), env)
    bundle = build_bundle(sources=_sources(env))
    assert bundle.repro["result"] is None and bundle.repro["undated"]
    assert [p.subject for p in bundle.problems] == ["repro"]
    markdown = render_markdown(bundle)
    assert "not included: it does not say when, where or by which command it was made" in markdown
    assert "DFD701" not in markdown and "stderr_tail" not in markdown


def test_repro_saves_where_when_and_which_command(tmp_path):
    from dflash_doctor.report.last_repro import made_here, made_when

    start = dt.datetime(2026, 11, 29, 9, 0, 0, 123456, tzinfo=dt.timezone.utc)
    made = made_here(start, start + dt.timedelta(seconds=90), argv=["/usr/bin/dflash-doctor", "repro", "--matrix"],
                     host=lambda: "box", cwd=lambda: "/w")
    assert made == {"command": "dflash-doctor repro --matrix", "host": "box", "cwd": "/w",
                    "started_at": "2026-11-29T09:00:00+00:00", "finished_at": "2026-11-29T09:01:30+00:00"}
    assert made_when({"facts": {"made": made}}) == start.replace(microsecond=0) + dt.timedelta(seconds=90)


def test_repro_json_option_errors(tmp_path):
    env = _planted_env(tmp_path)
    with pytest.raises(UsageError):
        build_bundle(repro_json=tmp_path / "missing.json", sources=_sources(env))
    not_repro = tmp_path / "scan.json"
    not_repro.write_text(json.dumps({"command": "scan"}))
    bundle = build_bundle(repro_json=not_repro, sources=_sources(env))
    assert [p.subject for p in bundle.problems] == ["repro"]
    assert "is not a repro result" in bundle.problems[0].reason


class _FakeNvml:
    """Follows gpus.nvml.NvmlDevices: two GPUs, the second lost."""

    def device_count(self):
        return 2

    def sample(self, index):
        from dflash_doctor.gpus.nvml import RawSample

        if index == 1:
            return RawSample(index=1, lost=True, errors=("handle: GPU is lost",))
        return RawSample(index=0, utilization=97.0, memory_used_mib=70000.0, memory_total_mib=143771.0,
                         name="NVIDIA H200", processes=())

    def shutdown(self):
        pass


def test_gpu_snapshot_through_the_gpus_package():
    snapshot = gpu_snapshot(open_devices=_FakeNvml, sleep=lambda s: None)
    assert [(g["index"], g["name"], g["utilization %"], g["lost"]) for g in snapshot["gpus"]] == [
        (0, "NVIDIA H200", 97.0, False), (1, None, None, True)]
    assert [p["subject"] for p in snapshot["problems"]] == ["GPU 1"]


def test_gpu_snapshot_without_nvml_says_why():
    from dflash_doctor.gpus.nvml import NvmlUnavailable

    def no_nvml():
        raise NvmlUnavailable("NVML could not start: no NVIDIA driver or GPU here")

    snapshot = gpu_snapshot(open_devices=no_nvml)
    assert snapshot["gpus"] == [] and snapshot["reason"] == "NVML could not start: no NVIDIA driver or GPU here"


@pytest.mark.timeout(200)
def test_report_command_writes_a_redacted_html_file(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch.utils.checkpoint as tuc\n\ndef f(fn, x):\n    return tuc.checkpoint(fn, x)\n")
    env = {"HF_TOKEN": HF, "TORCH_LOGS": "recompiles", "NCCL_TOKEN_URL": f"https://alice:{PASSWORD}@x.example",
           "DFLASH_DOCTOR_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "bug.html"
    proc = run_cli("report", str(tmp_path / "train.py"), "--no-probes", "--out", str(out), env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"dflash-doctor: wrote {out}")
    page = out.read_text()
    for secret in (HF, PASSWORD):
        assert secret not in page
    assert "TORCH_LOGS=recompiles" in page and "<h2>Scan</h2>" in page


def test_report_command_refuses_an_unknown_suffix(tmp_path):
    proc = run_cli("report", "--no-probes", "--out", str(tmp_path / "bug.pdf"), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"dflash-doctor: error: --out {tmp_path / 'bug.pdf'}: use a .md or .html file name"
    assert not (tmp_path / "bug.pdf").exists()


def test_remember_repro_saves_the_envelope_report_reads_back(tmp_path):
    from dflash_doctor.report.last_repro import load_repro, remember_repro

    env = {"DFLASH_DOCTOR_CACHE": str(tmp_path / "cache")}
    report = Report("repro", findings=[lookup("DFD701").finding()], facts={"verdict": "reproduced"},
                    exit_code_override=1)
    path = remember_repro(report, 1, env)
    assert path == last_repro_path(env) == tmp_path / "cache" / "last-repro.json"
    document = load_repro(path)
    assert (document["command"], document["exit_code"], document["facts"]["verdict"]) == ("repro", 1, "reproduced")
    assert [f["code"] for f in document["findings"]] == ["DFD701"]


def test_remember_repro_never_fails_the_repro(tmp_path):
    from dflash_doctor.report.last_repro import remember_repro

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    assert remember_repro(Report("repro"), 0, {"DFLASH_DOCTOR_CACHE": str(blocker)}) is None
