"""`dlrmtrain train` checks a config in the launching process, before any rank starts
(cli.train → validation.validate_config). That process needs torch for torchrun's agent,
but not TorchRec or fbgemm (seconds of CPU per launch): the check reads what codecs declare
(comm/declarations.py), the sharding rules (distributed/sharding_checks.py) and the
placement rules (comm/placement_choice.py), never the torch implementations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torchrec", "fbgemm_gpu")
QUICKSTART = str(Path(__file__).parents[2] / "configs" / "quickstart.yaml")

CHECK = """
import sys
from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.validation import validate_config
validate_config(load_config({config!r}, ["run.device=cpu", {override!r}]), world_size=2)
print(sorted(m for m in {heavy!r} if m in sys.modules))
"""


def _heavy_imported_by_the_check(override: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHECK.format(config=QUICKSTART, override=override, heavy=HEAVY)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_clis_config_check_imports_no_torchrec_or_fbgemm():
    # the codec facts and the placement rules are read for a deduping codec at the source
    assert _heavy_imported_by_the_check("comm.codec=dedup") == "[]"
    assert _heavy_imported_by_the_check("comm.codec=fp16") == "[]"  # and a qcomms codec


def test_the_finder_sees_torchrec_when_the_registry_is_imported():
    """The check above can fail: importing the codecs' implementations brings TorchRec."""
    done = subprocess.run([sys.executable, "-c", "import sys, dlrmtrain.comm.registry; "
                           "print('torchrec' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr
