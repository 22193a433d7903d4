"""Every Python block of README.md runs as written (in a fresh interpreter, in an empty folder). A block
right after a ``<!-- gpu-only -->`` line runs only where CUDA is; one after ``<!-- nvcc -->`` only
where nvcc is on PATH."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"(?:^(<!-- [\w-]+ -->)\n)?^```python\n(.*?)^```", re.M | re.S)


def _blocks() -> list:
    out = []
    for i, m in enumerate(_BLOCK.finditer(README.read_text(encoding="utf-8"))):
        marker, code = m.group(1), m.group(2)
        line = README.read_text(encoding="utf-8")[: m.start(2)].count("\n") + 1
        marks = []
        if marker == "<!-- gpu-only -->":
            marks.append(pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only block"))
        elif marker == "<!-- nvcc -->":
            marks.append(pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"))
        out.append(pytest.param(code, id=f"block{i}-line{line}", marks=marks))
    return out


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 4


@pytest.mark.parametrize("code", _blocks())
def test_readme_python_block_runs_as_written(code, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
