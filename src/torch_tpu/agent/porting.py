"""Finding CUDA-only code and its tpu replacement: the rules as data (:data:`RULES`), a scanner
(:func:`find_cuda_code`) and the rewrite of the findings that have a mechanical one.

>>> [f.rule for f in scan_text('x = x.cuda()\\ntorch.backends.cudnn.benchmark = True\\n', "a.py")]
['.cuda()', 'cuDNN flag']
>>> rewrite_text('model.to("cuda")\\n')
'model.to("tpu")\\n'
"""

from __future__ import annotations

import dataclasses
import os
import re


@dataclasses.dataclass(frozen=True)
class Rule:
    """A kind of CUDA-only code: ``pattern`` finds it; ``replacement`` (a ``re.sub`` template)
    rewrites the match where a mechanical rewrite exists (None: only ``advice``)."""

    name: str
    pattern: str
    advice: str
    replacement: str | None = None


RULES = (
    Rule(".cuda()", r"\.cuda\(\s*\)", 'move with .to("tpu")', '.to("tpu")'),
    Rule(
        ".cuda(index)",
        r"\.cuda\(\s*(\d+)\s*\)",
        'one process drives one chip: .to("tpu") (tpu:N only where the process owns N)',
        '.to("tpu")',
    ),
    Rule(
        "torch.cuda API",
        r"\btorch\.cuda\.(is_available|device_count|current_device|set_device|synchronize|"
        r"empty_cache|memory_allocated|max_memory_allocated|memory_reserved|max_memory_reserved|"
        r"reset_peak_memory_stats|memory_summary|manual_seed|manual_seed_all|get_device_name|"
        r"Stream|Event|stream|current_stream|memory|mem_get_info)\b",
        "torch.tpu has the same function",
        r"torch.tpu.\1",
    ),
    Rule(
        "torch.cuda.amp",
        r"\btorch\.cuda\.amp\.(autocast|GradScaler)\(",
        'use torch.amp with the device: torch.autocast("tpu", dtype=torch.bfloat16) '
        '(bfloat16 needs no scaler), torch.amp.GradScaler("tpu")',
        r'torch.amp.\1("tpu", ',
    ),
    Rule(
        'GradScaler("cuda")',
        r"""GradScaler\(\s*(["'])cuda\1""",
        'bfloat16 autocast needs no scaler; for float16 keep GradScaler with device "tpu"',
        r"GradScaler(\1tpu\1",
    ),
    Rule(
        'backend="nccl"',
        r"""backend\s*=\s*(["'])nccl\1""",
        "tpu_dist is the collective backend (init_process_group() picks it for tpu)",
        r"backend=\1tpu_dist\1",
    ),
    Rule(
        'device="cuda"',
        r"""(["'])cuda(:\d+)?\1""",
        'name the tpu device: "tpu"',
        r"\1tpu\1",
    ),
    Rule(
        "cuDNN flag",
        r"\btorch\.backends\.cudnn\.\w+",
        "no effect on tpu (XLA chooses its own algorithms); for speed on float32 matmuls use "
        "torch.set_float32_matmul_precision('high')",
    ),
    Rule(
        "TF32 flag",
        r"\btorch\.backends\.cuda\.matmul\.allow_tf32\b",
        "on tpu, torch.set_float32_matmul_precision('high') is the equivalent setting",
    ),
    Rule(
        "CUDA extension",
        r"\b(torch\.utils\.cpp_extension\.(CUDAExtension|load)|import\s+triton|from\s+triton)\b",
        "custom CUDA or Triton kernels do not run on tpu: write the kernel in Pallas or Helion "
        "(docs/kernels.md), or express it in PyTorch ops",
    ),
    Rule(
        "pin_memory + non_blocking",
        r"\bnon_blocking\s*=\s*True",
        "works unchanged (tpu copies are asynchronous); nothing to do",
    ),
)
_COMPILED = [(rule, re.compile(rule.pattern)) for rule in RULES]


@dataclasses.dataclass(frozen=True)
class Finding:
    """CUDA-only code at ``file:line``: the rule that found it, the code, what to do and, where
    a mechanical rewrite exists, the line rewritten."""

    file: str
    line: int
    rule: str
    code: str
    advice: str
    rewritten: str | None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def scan_text(text: str, file: str) -> list[Finding]:
    """The findings in one file's text: per line, each rule whose match no earlier rule's
    covers (``GradScaler("cuda")`` is that rule's, not also a ``"cuda"`` device string)."""
    out = []
    for number, code in enumerate(text.splitlines(), 1):
        covered: list[tuple[int, int]] = []
        for rule, pattern in _COMPILED:
            spans = [m.span() for m in pattern.finditer(code)]
            if any(not any(a <= s and e <= b for a, b in covered) for s, e in spans):
                rewritten = pattern.sub(rule.replacement, code) if rule.replacement else None
                out.append(Finding(file, number, rule.name, code.strip(), rule.advice, rewritten))
            covered += spans
    return out


def rewrite_text(text: str) -> str:
    """``text`` with every mechanical rewrite applied."""
    for rule, pattern in _COMPILED:
        if rule.replacement is not None:
            text = pattern.sub(rule.replacement, text)
    return text


def python_files(path: str) -> list[str]:
    """``path`` if it is a file, else the ``.py`` files below it (hidden folders skipped)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"find_cuda_code: no file or folder at {path!r}")
    found = []
    for folder, subfolders, files in os.walk(path):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return found


def find_cuda_code(path: str, rewrite: bool = False) -> dict:
    """Scan a file or folder for CUDA-only code; each finding with its ``file:line`` and tpu
    replacement. ``rewrite=True`` also rewrites the files in place where a mechanical rewrite
    exists (the others stay as findings to handle by hand)."""
    findings, rewritten = [], []
    for file in python_files(path):
        with open(file, encoding="utf-8") as f:
            text = f.read()
        findings += scan_text(text, file)
        if rewrite:
            new = rewrite_text(text)
            if new != text:
                with open(file, "w", encoding="utf-8") as f:
                    f.write(new)
                rewritten.append(file)
    return {
        "findings": [dataclasses.asdict(f) | {"where": f.where} for f in findings],
        "files_rewritten": rewritten,
        "by_hand": sum(1 for f in findings if f.rewritten is None),
    }
