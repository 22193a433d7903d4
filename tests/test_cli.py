"""The command line: `mxgemm --help` and the package import stay light (no torch, no TVM)."""

import json
import subprocess
import sys


def _modules_after(code: str) -> dict[str, bool]:
    probe = f"import sys, json\n{code}\nprint(json.dumps({{m: m in sys.modules for m in ('torch', 'tvm')}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_importing_mxgemm_and_its_cli_loads_neither_torch_nor_tvm():
    assert _modules_after("import mxgemm, mxgemm.cli") == {"torch": False, "tvm": False}
    help_run = (
        "import mxgemm.cli\ntry:\n    mxgemm.cli.main(['pack', '--help'])\nexcept SystemExit:\n    pass"
    )
    assert _modules_after(help_run) == {"torch": False, "tvm": False}


def test_public_names_load_on_first_use():
    assert _modules_after("import mxgemm\nmxgemm.MxConfig('mxfp4')")["torch"] is True
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mxgemm; print(sorted(n for n in mxgemm.__all__ if not hasattr(mxgemm, n)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"
