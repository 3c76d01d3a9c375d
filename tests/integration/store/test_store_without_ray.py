"""The experiment folder is read without Ray: `status`, `export` and `report` on a finished
sweep in a Python where `import ray` fails; and a folder of another format is refused in one
line by every verb that reads it."""

import json
import subprocess
import sys

import pytest
from sweeps import SHARES_THE_FINISHED_SWEEP

from schedule_search.cli import main
from schedule_search.store.experiment import FORMAT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: The CLI in a Python whose `import ray` (and any `ray.*`) raises ImportError.
WITHOUT_RAY = """
import sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"ray is not importable here ({name})")
        return None
sys.meta_path.insert(0, NoRay())
from schedule_search.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cli_without_ray(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *argv], capture_output=True, text=True, timeout=300
    )


@SHARES_THE_FINISHED_SWEEP
def test_status_export_and_report_run_where_ray_cannot_be_imported(finished_sweep, tmp_path):
    storage, experiment = finished_sweep.copy_to(tmp_path)
    name, where = finished_sweep.name, ["--storage", str(storage)]
    assert cli_without_ray("train", "--help").returncode == 0  # the probe itself works
    refused = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY.replace("from schedule_search.cli", "import ray#")],
        capture_output=True,
        text=True,
    )
    assert "ray is not importable here" in refused.stderr
    for verb in ("status", "export", "report"):
        done = cli_without_ray(verb, name, *where)
        assert done.returncode == 0, (verb, done.stderr[-3000:])
    assert (experiment.root / "recipe.yaml").is_file()
    assert (experiment.root / "report" / "report.md").is_file()


@SHARES_THE_FINISHED_SWEEP
def test_a_folder_of_another_format_is_refused_in_one_line(finished_sweep, tmp_path, capfd):
    storage, experiment = finished_sweep.copy_to(tmp_path)
    settings = experiment.root / "sweep.json"
    recorded = json.loads(settings.read_text())
    assert recorded["format"] == FORMAT
    before = {p: p.stat().st_mtime_ns for p in experiment.root.rglob("*") if p.is_file()}
    for found, shown in ((None, "none"), (FORMAT + 1, str(FORMAT + 1))):
        changed = {k: v for k, v in recorded.items() if k != "format"}
        if found is not None:
            changed["format"] = found
        settings.write_text(json.dumps(changed))
        before[settings] = settings.stat().st_mtime_ns
        for verb in ("status", "export", "report", "resume", "transfer"):
            code = main([verb, finished_sweep.name, "--storage", str(storage)])
            err = capfd.readouterr().err  # the process's stderr, not Python's alone
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1, (verb, err[-2000:])
            assert f"format {shown}" in lines[0] and f"reads format {FORMAT}" in lines[0], lines
    after = {p: p.stat().st_mtime_ns for p in experiment.root.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing launched
