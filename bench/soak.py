"""A soak: a linreg sweep of 40 trials, 2 at a time, on a `ray start` cluster, while a bounded
random chaos loop SIGKILLs a Ray Train worker of a running trial or the sweep's driver (then
resumes it) every 20-60 s; audited against an undisturbed sweep of the same seed.

The audit: every trial ended once (completed), no params twice, `optuna.journal` holds each
trial once as COMPLETE with the value its records hold, and the best trial has the params and
the loss of the undisturbed sweep's best. The sampler is `random` and the scheduler FIFO:
their trials do not depend on the order results arrive in, so two sweeps of one seed run the
same trials however the kills shift their timing (TPE's and ASHA's would not).

The cluster: one head of 4 logical CPUs on this machine (2 trials of 2 one-CPU workers; the
workers are tiny) with 2 trial slots, the sweep on it with `--address`, as on a real cluster.

Usage: python bench/soak.py [--trials 40] [--seed 0]   (about 25 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from ray.util import get_node_ip_address

from schedule_search.store.experiment import Experiment
from schedule_search.train.launch import free_port

RESULTS = Path(__file__).resolve().parent / "results" / "soak"
CLI = [sys.executable, "-m", "schedule_search.cli"]
RAY = str(Path(sys.executable).with_name("ray"))


def space(trials: int, seed: int) -> dict:
    return {
        "name": "soak",
        "samples": trials,
        "seed": seed,
        "sampler": "random",
        "scheduler": "fifo",
        "base": {
            "task": {"name": "linreg", "dim": 64, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "window": {"policy": "microbatches", "microbatches": 2},
            "budget": {"horizon": 2.0, "eval_at": [0.5, 1.0, 1.5]},
        },
        "params": {
            "optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 0.3},
            "schedule.gamma": {"type": "uniform", "low": 0.0, "high": 1.0},
        },
    }


def cluster_token(work: Path) -> None:
    """The cluster runs in Ray's token mode (its default) with a fresh token of its own: the
    head and every command of the soak read it from the file `RAY_AUTH_TOKEN_PATH` names."""
    token = work / "cluster_token"
    token.write_text(secrets.token_hex(24))
    token.chmod(0o600)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def launch(command: list[str], storage: Path, name: str) -> subprocess.Popen:
    """The CLI `command`, its output appended to `<storage>/<name>.err`."""
    storage.mkdir(parents=True, exist_ok=True)
    log = open(storage / f"{name}.err", "a")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def sweep(path: Path, name: str, storage: Path, address: str) -> subprocess.Popen:
    command = [*CLI, "sweep", str(path), "--name", name, "--workers", "2", "--concurrency", "2"]
    return launch([*command, "--address", address, "--storage", str(storage)], storage, name)


def resume(name: str, storage: Path) -> subprocess.Popen:
    return launch([*CLI, "resume", name, "--storage", str(storage)], storage, name)


def running_workers(experiment: Experiment) -> list[int]:
    """The live Ray Train worker pids of trials that have not ended, as each recorded itself."""
    pids = []
    for trial_id in experiment.trial_ids() if experiment.root.exists() else []:
        if experiment.read_trial_json(trial_id, "result.json"):
            continue
        for placement in (experiment.trial_dir(trial_id) / "workers").glob("rank-*.json"):
            pid = json.loads(placement.read_text())["pid"]
            if Path(f"/proc/{pid}").exists():
                pids.append(pid)
    return pids


def chaos(driver: subprocess.Popen, experiment: Experiment, storage: Path, rng: random.Random):
    """Every 20-60 s, kill a Ray Train worker or the driver (even odds; a worker as soon as a
    running trial has one), until the sweep ends with exit 0; returns the kills."""
    kills = {"worker": 0, "driver": 0}
    next_kill, target = time.monotonic() + rng.uniform(20, 60), rng.choice(list(kills))
    while True:
        code = driver.poll()
        if code is not None:
            if code == 0:
                return kills
            raise SystemExit(f"the sweep ended with exit {code}")
        workers = running_workers(experiment) if target == "worker" else []
        if time.monotonic() >= next_kill and (target == "driver" or workers):
            if target == "worker":
                os.kill(rng.choice(workers), signal.SIGKILL)
            else:
                driver.send_signal(signal.SIGKILL)
                driver.wait()
                driver = resume(experiment.root.name, storage)
            kills[target] += 1
            print(f"{time.strftime('%H:%M:%S')} kills so far: {kills}", flush=True)
            next_kill, target = time.monotonic() + rng.uniform(20, 60), rng.choice(list(kills))
        time.sleep(0.5)


def audit(experiment: Experiment, calm: Experiment, trials: int) -> dict:
    rows = experiment.rows()
    params = [tuple(sorted(r.params.items())) for r in rows]
    study = optuna.load_study(
        study_name="soak",
        storage=JournalStorage(JournalFileBackend(str(experiment.root / "optuna.journal"))),
    )
    recorded = {r.trial_id: r.val_loss for r in rows}
    journal = {t.user_attrs.get("trial_id"): t.value for t in study.trials}
    best, calm_best = experiment.best(2.0), calm.best(2.0)
    assert best is not None and calm_best is not None
    return {
        "trials": len(rows),
        "completed": sum(r.state == "completed" for r in rows),
        "distinct_params": len(set(params)),
        "orphaned": len(list((experiment.root / "trials" / ".orphaned").glob("*"))),
        "journal_trials": len(study.trials),
        "journal_complete": sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials),
        "journal_equals_records": journal == recorded,
        "restarts": sum(r.restarts for r in rows),
        "best": {"trial": best.trial_id, "loss": best.val_loss, "params": best.params},
        "calm_best": {
            "trial": calm_best.trial_id,
            "loss": calm_best.val_loss,
            "params": calm_best.params,
        },
        "best_same_as_calm": (best.params, best.val_loss) == (calm_best.params, calm_best.val_loss),
        "ok": (
            trials == len(rows) == len(set(params)) == len(study.trials)
            and all(r.state == "completed" for r in rows)
            and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
            and journal == recorded
            and (best.params, best.val_loss) == (calm_best.params, calm_best.val_loss)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="a folder of an earlier run: its finished "
        "undisturbed sweep is kept, the soak starts again (default: a new temporary folder)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="soak."))
    shutil.rmtree(work / "runs" / "soak", ignore_errors=True)
    (work / "runs" / "soak.err").unlink(missing_ok=True)
    path = work / "space.yaml"
    path.write_text(yaml.safe_dump(space(args.trials, args.seed)))
    storage = work / "runs"
    cluster_token(work)
    port = free_port()
    head = subprocess.Popen(  # in a session of its own: what is killed at the end
        [
            RAY,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=4",
            f"--dashboard-port={free_port()}",
            '--resources={"trial_slot": 2}',
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert head.wait(timeout=180) == 0, "ray start failed"
    address = f"{get_node_ip_address()}:{port}"
    started = time.monotonic()
    try:
        calm = Experiment(storage / "calm")
        done = calm.root.exists() and len(calm.finished(2.0)) == args.trials
        if not done:
            shutil.rmtree(calm.root, ignore_errors=True)
            swept = sweep(path, "calm", storage, address)
            assert swept.wait() == 0, f"the undisturbed sweep failed: {storage / 'calm.err'}"
        calm_s = time.monotonic() - started
        print(f"undisturbed sweep: {calm_s:.0f} s", flush=True)
        experiment = Experiment(storage / "soak")
        kills = chaos(sweep(path, "soak", storage, address), experiment, storage, rng)
        soak_s = time.monotonic() - started - calm_s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # the head's raylet, GCS and workers
    report = {"kills": kills, "calm_s": round(calm_s), "soak_s": round(soak_s)}
    report |= audit(experiment, calm, args.trials)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
