"""Progress on a log line: the step number and the throughput, in the forms trainers print.

Throughput comes with its unit, and only the number that belongs to the unit counts, never a neighbour:
- value then unit: '7.1 Ktok/s', '7.1Ktok/s', '21500 tokens/s', '12.5 samples/s', tqdm's '4.95it/s' and '1.3s/it';
- unit then value: 'tokens/s=9800', 'tok/s: 7100', torchtitan's 'tps: 5,856' (and its older 'wps'),
  'samples_per_second=12.3';
- Megatron's 'elapsed time per iteration (ms): 812.4' (iterations per second, inverted);
- SGLang's 'gen throughput (token/s): 1635.11' (unit in parentheses before the value).
A rate labelled prompt, input or prefill throughput (vLLM's 'Avg prompt throughput', SGLang's prefill 'input
throughput') is skipped: prefill comes in bursts and idles at 0, the steady rate is the generation one beside it.
'loss=2.1 tokens/s=9800' is 9800 tok/s: the 2.1 belongs to 'loss='. A number before a unit counts only when it is
not the value of another key (`tput=7.1 Ktok/s` counts, `loss=2.1 tok/s` does not).
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

TOK_S = "tok/s"
SAMPLES_S = "samples/s"
IT_S = "it/s"

_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6}
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# Key words whose value is a throughput ('tput=7.1 Ktok/s' reads 7.1 K); any other key=value is someone else's.
_RATE_KEYS = {"tput", "throughput", "speed", "rate", "tps", "tgs", "tokens", "tok", "toks", "perf"}

_UNIT_WORD = {"tok": TOK_S, "toks": TOK_S, "token": TOK_S, "tokens": TOK_S, "sample": SAMPLES_S,
              "samples": SAMPLES_S, "it": IT_S, "its": IT_S}
# Unit first, then '=' or ':' and the value.
_AFTER = re.compile(
    r"(?<![\w/])(?P<key>tok(?:en)?s?/s(?:ec)?(?:/gpu)?|tps|wps|tok(?:en)?s?_per_s(?:ec(?:ond)?)?"
    r"|(?:train_)?samples?_per_s(?:ec(?:ond)?)?|samples?/s(?:ec)?|it/s)[\x27\x22)]?\s*[:=]\s*(?P<num>" + _NUMBER + r")"
    r"\s?(?P<si>[kKmM]?)(?![\w.])", re.IGNORECASE)
# Value, then an optional SI prefix, then the unit.
_BEFORE = re.compile(
    r"(?:(?<=[\s(\[,|;=:])|^)(?P<num>" + _NUMBER + r")\s?(?P<si>[kKmM]?)\s?(?P<unit>tok(?:en)?s?|samples?|its?)"
    r"\s?/\s?s(?:ec)?\b", re.IGNORECASE)
_SECONDS_PER_IT = re.compile(r"(?:(?<=[\s(\[,|])|^)(?P<num>\d+(?:\.\d+)?)\s?s/it\b")
_MEGATRON = re.compile(r"elapsed time per iteration \(ms\):\s*(?P<num>\d+(?:\.\d+)?)")
_KEY_BEFORE = re.compile(r"(?P<key>[A-Za-z_]\w*)\s*[=:]\s*$")
_PREFILL = re.compile(r"(?i)\b(?:prompt|input|prefill)\b[^,|;]{0,16}$")  # the label just before a rate

# (not a Slurm job step: 'oom-kill event(s) in step 59137890.batch cgroup')
STEP_AT = re.compile(r"[Ss](?:tep|TEP)\s*[=:]?\s*(?P<step>\d+)(?!\d|\.?[A-Za-z_])")
_ITERATION = re.compile(r"\biteration\s+(?P<step>\d+)\s*/")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def rate(text: str) -> Optional[Tuple[float, str]]:
    """(value, unit) of the throughput on the line, or None. Units: tok/s, samples/s, it/s."""
    if "/s" in text or "_per_s" in text or "tps" in text or "wps" in text:
        for after in _AFTER.finditer(text):
            if _PREFILL.search(text, max(0, after.start() - 32), after.start()):
                continue
            key = after.group("key").lower()
            unit = SAMPLES_S if "sample" in key else IT_S if key == "it/s" else TOK_S
            return _number(after.group("num")) * _SCALE[after.group("si")], unit
        for before in _BEFORE.finditer(text):
            key = _KEY_BEFORE.search(text, max(0, before.start() - 24), before.start())
            if key is not None and key.group("key").lower() not in _RATE_KEYS:
                continue
            if _PREFILL.search(text, max(0, before.start() - 32), before.start()):
                continue
            unit = _UNIT_WORD[before.group("unit").lower()]
            return _number(before.group("num")) * _SCALE[before.group("si")], unit
    if "s/it" in text:
        slow = _SECONDS_PER_IT.search(text)
        if slow is not None and float(slow.group("num")) > 0:
            return 1.0 / float(slow.group("num")), IT_S
    if "per iteration (ms)" in text:
        mega = _MEGATRON.search(text)
        if mega is not None and float(mega.group("num")) > 0:
            return 1000.0 / float(mega.group("num")), IT_S
    return None


def throughput(text: str) -> Optional[float]:
    """tok/s on the line ('7.1 Ktok/s', '21500 tokens/s', 'tps: 5,856'), or None; other units are None."""
    found = rate(text)
    return found[0] if found is not None and found[1] == TOK_S else None


def step(text: str) -> Optional[int]:
    """The step number after 'step=' / 'step ' / 'Step:' (not 'global_step', not 'steps'), or Megatron's
    'iteration N/'; None when the line has none."""
    for word in ("step", "Step", "STEP"):
        start = text.find(word)
        while start >= 0:
            if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                match = STEP_AT.match(text, start)
                if match:
                    return int(match.group("step"))
            start = text.find(word, start + 4)
    if "iteration" in text:
        match = _ITERATION.search(text)
        if match:
            return int(match.group("step"))
    return None
