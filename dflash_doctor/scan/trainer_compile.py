"""DFD205: a Hugging Face training configuration with torch_compile=True, which runs under nn.DataParallel when
the script is started without a launcher on a machine with several GPUs."""
from __future__ import annotations

import ast

from dflash_doctor.rules.scan import HF_TRAINER_COMPILE_DATA_PARALLEL
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import CompiledRef, describe
from dflash_doctor.scan.scopes import Scope

# The libraries whose training configurations are TrainingArguments (or extend it, as TRL's SFTConfig and
# sentence-transformers' SentenceTransformerTrainingArguments do) and pass torch_compile to the Trainer.
TRAINING_LIBRARIES = ("transformers.", "trl.", "sentence_transformers.")
# What a script run by a launcher (one process per GPU: no DataParallel) reads or calls.
LAUNCHED = ("LOCAL_RANK", "WORLD_SIZE", "init_process_group")


class TrainerCompileRule(FileCheck):
    # a compiled model is recognised through the names bound to torch.compile, which the call graph's pass
    # collects (analysis.py: compile names only where a graph is built)
    needs_graph = True

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        switch = next((k for k in node.keywords if k.arg == "torch_compile"), None)
        if switch is None:
            self._compiled_model(node, scope)
            return
        if not (isinstance(switch.value, ast.Constant) and switch.value.value is True):
            return
        dotted = self.ctx.resolver.dotted(node.func, scope, node.lineno) or ""
        if not dotted.startswith(TRAINING_LIBRARIES) or self._launched():
            return
        self.ctx.report(
            HF_TRAINER_COMPILE_DATA_PARALLEL, node,
            f"{describe(node.func)}(torch_compile=True): started without a launcher on a machine with several "
            "GPUs, the Trainer wraps the compiled model in nn.DataParallel, whose replica threads run it (public "
            "reports: failures, huggingface/transformers#22326, or training uncompiled, #25152, #34656); launch one "
            "process per GPU (torchrun --nproc_per_node N, accelerate launch)",
            {"config": dotted, "launcher_hints": list(LAUNCHED)},
        )

    def _launched(self) -> bool:
        return any(word in self.ctx.text for word in LAUNCHED)

    def _compiled_model(self, node: ast.Call, scope: Scope) -> None:
        """`Trainer(model=torch.compile(model), ...)`: DataParallel would replicate the compiled module."""
        resolver = self.ctx.resolver
        dotted = resolver.dotted(node.func, scope, node.lineno) or ""
        if not dotted.startswith(TRAINING_LIBRARIES) or not dotted.endswith("Trainer") or self._launched():
            return
        model = next((k.value for k in node.keywords if k.arg == "model"), node.args[0] if node.args else None)
        ref = resolver.callee(model, scope, node.lineno) if model is not None else None
        if model is None or not isinstance(ref, CompiledRef):
            return
        self.ctx.report(
            HF_TRAINER_COMPILE_DATA_PARALLEL, node,
            f"{describe(node.func)}(model={describe(model)}) is handed a torch.compile'd model (compiled at line "
            f"{ref.line}): started without a launcher on a machine with several GPUs, the Trainer replicates it with "
            "nn.DataParallel, the form that failed at its first step (DFD204); launch one process per GPU (torchrun "
            "--nproc_per_node N, accelerate launch)",
            {"trainer": dotted, "compiled_line": ref.line, "launcher_hints": list(LAUNCHED)},
        )
