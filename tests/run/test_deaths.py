"""How `run` classifies a thread's death (supervise/agent.py): the FX patcher race is read from the error's own
words, or from a Dynamo guard that broke while another thread traced; real exceptions, real tracebacks."""
from __future__ import annotations

from dflash_doctor.supervise.agent import _guard_broke

# A function named like Dynamo's guard builder, compiled under the path it has in a torch install, so the
# traceback it raises through is the one the classifier reads (the error torch 2.13 raised beside a tracer).
_GUARDS = compile("def CLOSURE_MATCH(closure):\n    return closure[0]\n",
                  "/srv/venv/lib/python3.11/site-packages/torch/_dynamo/guards.py", "exec")


def _raised(fn, *args) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the exception is the test's subject
        return exc
    raise AssertionError("did not raise")


def test_an_error_raised_inside_a_guard_builder_and_wrapped_is_a_broken_guard():
    namespace: dict = {}
    exec(_GUARDS, namespace)

    def compile_frame():
        try:
            namespace["CLOSURE_MATCH"](None)
        except TypeError as exc:
            raise RuntimeError("InternalTorchDynamoError: TypeError: 'NoneType' object is not subscriptable") from exc

    assert _guard_broke(_raised(compile_frame))


def test_the_guard_failed_wording_is_a_broken_guard_and_a_plain_type_error_is_not():
    assert _guard_broke(AssertionError("Guard failed on the same frame it was created. This is a bug"))
    def unguarded(value):
        return value[0]

    assert not _guard_broke(_raised(unguarded, None))  # the same TypeError outside a guard builder
