"""Atomic writes that the kernel refuses: the error names the file, the previous content
stays, and no temporary file is left. The tables a user reads are JSON that any parser reads."""

import errno
import json
import math
import subprocess
import sys

import pytest
from helpers import strict_loads

from schedule_search.core.files import strict_json

REFUSED_WRITE = """
import json, resource, signal, sys
from pathlib import Path
from schedule_search.core.files import atomic_write_bytes

path = Path(sys.argv[1]) / "metrics.json"
atomic_write_bytes(path, b"[1]")  # fits
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    atomic_write_bytes(path, b"x" * (1 << 20))  # past the limit: refused at a write or flush
except OSError as err:
    print(json.dumps({"errno": err.errno, "filename": str(err.filename), "message": str(err)}))
"""


def test_a_refused_write_names_its_file_and_keeps_the_previous_content(tmp_path):
    # A real kernel refusal (EFBIG from a file-size limit, as ENOSPC from a full volume): a
    # failed write, flush or close raises an OSError that names no file by itself.
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_WRITE, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused = json.loads(done.stdout)
    assert refused["errno"] == errno.EFBIG, refused
    assert refused["filename"] == str(tmp_path / "metrics.json")
    assert refused["message"].endswith(f"'{tmp_path / 'metrics.json'}'")
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left
    assert (tmp_path / "metrics.json").read_bytes() == b"[1]"


def test_strict_json_writes_what_is_not_finite_as_null_wherever_it_lies():
    data = {"loss": math.inf, "rows": [1.5, math.nan, {"gap": -math.inf}], "pair": (2, math.nan)}
    data |= {"run": None, "n": 3, "name": "recipe", "ok": True}
    assert strict_loads(strict_json(data)) == {
        "loss": None,
        "rows": [1.5, None, {"gap": None}],
        "pair": [2, None],
        "run": None,
        "n": 3,
        "name": "recipe",
        "ok": True,
    }
    with pytest.raises(ValueError, match="NaN"):
        strict_loads(json.dumps({"loss": math.nan}))  # what Python's json writes by default
