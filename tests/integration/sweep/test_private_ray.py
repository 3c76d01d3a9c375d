"""Who can reach the Ray a sweep runs on: the local Ray it starts refuses any client without
its token (measured on every socket its processes listen on, with `ss`, real gRPC calls and
real HTTP requests), and a cluster in token mode is joined with the user's token, or refused in
one line before anything is written."""

import contextlib
import glob
import http.client
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import ray
from processes import kill_session, session_pids
from sweeps import CLI, SPACE, cli, resting_task, write_space

from schedule_search.sweep.ray_env import AUTH_VARIABLES, TOKEN_FILE
from schedule_search.train.launch import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
#: The CPUs the token test's cluster head says it has: not this machine's count, whatever
#: that is, so a concurrency taken from the machine instead of the cluster fails the test.
CLUSTER_CPUS = (os.cpu_count() or 1) + 1


def ray_methods() -> list[str]:
    """One real method of each of Ray's gRPC services: a server routes a call before it
    checks the token, so only a method it serves can show the refusal. The object manager's
    service has no Python stub; its `Push` is named by hand."""
    generated = Path(ray.__file__).parent / "core" / "generated"
    first: dict[str, str] = {}
    for stub in sorted(glob.glob(str(generated / "*_pb2_grpc.py"))):
        for method in re.findall(r"['\"](/ray\.rpc\.\w+/\w+)['\"]", Path(stub).read_text()):
            first.setdefault(method.split("/")[1], method)
    return [*first.values(), "/ray.rpc.ObjectManagerService/Push"]


def listeners(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket that a process in `pids` listens on."""
    shown = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in shown.splitlines():
        local = line.split()[3]
        address, port = local.rsplit(":", 1)
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids:
                found.append((address.strip("[]"), int(port), pid))
    return found


def answer_without_token(host: str, port: int, methods: list[str]) -> str:
    """What a client that holds no token gets from `host:port`: "refused" (HTTP 401, or a gRPC
    UNAUTHENTICATED with no call answered), "metrics" (a Prometheus exporter's read-only text),
    or what else it got."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/", timeout=3) as response:
            body = response.read(4096).decode(errors="replace")
        return "metrics" if body.startswith("# HELP") else f"HTTP {response.status}: {body[:80]}"
    except urllib.error.HTTPError as err:
        return "refused" if err.code == 401 else f"HTTP {err.code}"
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        pass  # not HTTP/1: gRPC
    channel = grpc.insecure_channel(f"{host}:{port}")
    codes = []
    for method in methods:
        try:
            channel.unary_unary(method)(b"", timeout=3)
            codes.append(f"answered {method}")
        except grpc.RpcError as err:
            codes.append(err.code().name)
            if err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                break  # it does not speak gRPC: no other method will be answered either
    channel.close()
    if "UNAUTHENTICATED" in codes and not any(c.startswith("answered") for c in codes):
        return "refused"
    return f"gRPC {sorted(set(codes))}"


#: A refused client retries for Ray's connect window (~20 s, one try a second); two tries show
#: the refusal as well (Ray's own variable for that window, read by the client alone).
TWO_TRIES = {"RAY_gcs_server_port_wait_time_s": "2"}


def without_token(home: Path) -> dict[str, str]:
    """This environment less every way Ray finds a token (HOME: no ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES}
    return env | {"HOME": str(home)}


def connect(address: str, env: dict[str, str], timeout: float = 90) -> tuple[bool, str]:
    """Whether a client with `env` joins the Ray at `address` (and what it printed). A client
    that is refused may also hang retrying: not joined by `timeout` counts as not joined."""
    script = f"import ray; ray.init(address={address!r}); print('joined', ray.cluster_resources())"
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as err:
        return False, str(err.stderr or "")[-2000:]
    return done.returncode == 0 and "joined" in done.stdout, done.stderr[-2000:]


def machine_address() -> str:
    """This machine's network (non-loopback) address, as Ray's nodes advertise it."""
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


@pytest.mark.cost(45)
def test_a_sweeps_local_ray_refuses_every_client_without_its_token(tmp_path):
    # One long trial: Ray is inspected while it trains, then the whole session is killed. Its
    # task rests between micro-batches: the workers (and their sockets) stay up while the
    # test probes its Ray, at a few percent of a CPU instead of two CPUs.
    code = resting_task(tmp_path)
    base = SPACE["base"] | {
        "task": SPACE["base"]["task"] | {"name": "resting:make"},
        "budget": {"horizon": 20000.0, "eval_at": [0.5]},
    }
    space = write_space(tmp_path, samples=1, scheduler="fifo", base=base)
    storage = tmp_path / "runs"
    log = tmp_path / "sweep.log"
    with log.open("w") as output:
        driver = subprocess.Popen(
            [*CLI, "sweep", str(space), "--workers", "2", "--storage", str(storage)],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ | {"PYTHONPATH": str(code)},
        )
    try:
        experiment = storage / SPACE["name"]
        token_file = experiment / TOKEN_FILE
        deadline = time.monotonic() + 240
        while not list(experiment.glob("trials/*/metrics.json")):
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no trial reported"
            time.sleep(0.2)
        token = token_file.read_text()
        assert len(token) >= 32
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

        ray_pids = session_pids(driver.pid)
        # The driver's console settings stay its own: Ray's processes, which start from the
        # driver's environment, keep reporting unhandled errors in their logs.
        for pid in ray_pids - {driver.pid}:
            with contextlib.suppress(OSError):  # one that ended meanwhile
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                assert not [e for e in environ if e.startswith(b"RAY_IGNORE_UNHANDLED")], pid
        sockets = listeners(ray_pids)
        outside = [(a, p, pid) for a, p, pid in sockets if not a.startswith("127.")]
        names = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for *_, pid in outside}
        assert any(b"gcs_server" in name for name in names), names  # the exposure is measured
        methods = ray_methods()
        host = machine_address()
        answers = {
            (address, port): answer_without_token(
                host if address in ("*", "0.0.0.0", "::") else address, port, methods
            )
            for address, port, _ in outside
        }
        # Two kinds of socket answer a client without the token, neither Ray's control plane:
        # Ray's Prometheus exporters (read-only metrics text on every interface: Ray binds
        # them to loopback only when the node address is loopback, which `ray.init` does not
        # allow on Linux), and the TCPStore torch's gloo group rendezvous on, one in a Ray
        # Train worker (torch has no authentication). Every other socket refuses.
        for address, port, pid in outside:
            answer = answers[(address, port)]
            if answer not in ("refused", "metrics"):
                owner = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                answers[(address, port)] = (
                    "rendezvous" if owner == b"ray::RayTrainWorker" else answer
                )
        assert set(answers.values()) <= {"refused", "metrics", "rendezvous"}, answers
        assert list(answers.values()).count("rendezvous") <= 1, answers
        assert list(answers.values()).count("refused") >= 5, answers

        gcs = next(
            port
            for address, port, pid in outside
            if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and answers[(address, port)] == "refused"
        )
        joined, shown = connect(
            f"{host}:{gcs}",
            without_token(tmp_path)
            | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)},
        )
        assert joined, shown
        joined, shown = connect(f"{host}:{gcs}", without_token(tmp_path) | TWO_TRIES, timeout=15)
        assert not joined, shown
        joined, shown = connect(
            f"{host}:{gcs}",
            without_token(tmp_path)
            | TWO_TRIES
            | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x" * 43},
            timeout=15,
        )
        assert not joined, shown
        assert driver.poll() is None, "the sweep ended while its Ray was probed"
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        kill_session(driver.pid)
    written = [p for p in storage.rglob("*") if p.is_file() and p.name != TOKEN_FILE]
    for path in [log, *written]:
        assert token.encode() not in path.read_bytes(), path


@pytest.mark.cost(20)
def test_two_local_rays_in_one_process_each_get_a_fresh_token(tmp_path):
    """Ray reads its authentication once a process; `local_token` makes it read again, so a
    second local Ray in the same process (a notebook, a test) starts and is joined with its
    own token, and the user's variables come back afterwards."""
    script = f"""
import logging, os
from pathlib import Path
import ray
from schedule_search.sweep.ray_env import local_token
os.environ["RAY_AUTH_MODE"] = "disabled"
tokens = []
for k in range(2):
    folder = Path({str(tmp_path)!r}) / str(k)
    folder.mkdir()
    with local_token(folder) as path:
        tokens.append(path.read_text())
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.ERROR)
        assert ray.get(ray.remote(lambda: os.environ["RAY_AUTH_TOKEN_PATH"]).remote()) == str(path)
        ray.shutdown()
    assert not path.exists()
assert tokens[0] != tokens[1]
print("restored", os.environ["RAY_AUTH_MODE"], os.environ.get("RAY_AUTH_TOKEN_PATH"))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=240,
        env=without_token(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["restored", "disabled", "None"], done.stdout


@pytest.fixture
def token_cluster(tmp_path):
    """A `ray start --head` cluster in token mode on this machine, its token in a file."""
    token = tmp_path / "cluster_token"
    token.write_text("c" * 48)
    token.chmod(0o600)
    port = free_port()
    env = without_token(tmp_path) | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    # Without --block `ray start` returns once the head is up, leaving its processes in the
    # session it led: that session is what is killed afterwards (`ray stop` would stop every
    # Ray on the machine, another test's too).
    head = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            f"--port={port}",
            # One more than this machine has: the default concurrency counts the cluster's.
            f"--num-cpus={CLUSTER_CPUS}",
            '--resources={"trial_slot": 1}',
            f"--dashboard-port={free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    address = f"{machine_address()}:{port}"
    try:
        shown, _ = head.communicate(timeout=180)
        assert head.returncode == 0, shown[-3000:]
        yield address, token
    finally:
        kill_session(head.pid)
        forget_the_head(address)


def forget_the_head(address: str) -> None:
    """`ray start` writes its head's address where a later plain `ray.init()` on this machine
    looks for a cluster to join (Ray's `ray_current_cluster`); `ray stop` removes it, a killed
    head does not. Removed here while it still names this head (another test's cluster may
    have written its own since)."""
    from ray._private.utils import get_ray_address_file, read_ray_address

    if read_ray_address() == address:
        Path(get_ray_address_file(None)).unlink(missing_ok=True)


@pytest.mark.cost(45)
def test_a_cluster_in_token_mode_is_joined_with_its_token_or_refused_in_one_line(
    tmp_path, token_cluster
):
    address, token = token_cluster
    space = write_space(tmp_path, samples=1, scheduler="fifo")
    sweep = ["sweep", str(space), "--workers", "1", "--address", address]
    refused = without_token(tmp_path) | TWO_TRIES
    refusals = {
        "no token": refused | {"RAY_AUTH_MODE": "token"},
        "a wrong token": refused | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "w" * 48},
        "no token mode": refused,
    }
    for case, env in refusals.items():
        storage = tmp_path / case.replace(" ", "_")
        done = cli(*sweep, "--storage", str(storage), env=env)
        assert done.returncode == 2, (case, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"--address {address}" in lines[0], (case, lines)
        assert "RAY_AUTH_TOKEN" in lines[0], lines[0]
        assert not storage.exists(), case

    storage = tmp_path / "joined"
    env = without_token(tmp_path) | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token.read_text()}
    done = cli(*sweep, "--storage", str(storage), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads((storage / SPACE["name"] / "sweep.json").read_text())
    assert settings["address"] == address
    assert settings["concurrency"] == CLUSTER_CPUS  # the cluster's CPUs // 1 worker
    assert not (storage / SPACE["name"] / TOKEN_FILE).exists()  # the cluster's token is its own


@pytest.mark.cost(5)
def test_an_address_where_no_cluster_runs_is_refused_in_one_line(tmp_path):
    """Nothing listens at the address (a typo, a wrong port, a head that is down): one line
    naming it and why, exit 2, nothing written, before Ray's client is started (it would retry
    for its whole connect window first: 824 s here with Ray's defaults). A name that does not
    resolve is refused the same way."""
    space = write_space(tmp_path, samples=1, scheduler="fifo")
    storage = tmp_path / "runs"
    port = free_port()  # free a moment ago: nothing listens there
    # The resolver's words for a name it cannot resolve differ by machine (no DNS server
    # reachable, or one that answers "no such name"): only the refused port's are fixed.
    for address, cause in (
        (f"127.0.0.1:{port}", "Connection refused"),
        ("no-such-host.invalid:6379", None),
    ):
        sweep = ["sweep", str(space), "--workers", "1", "--address", address]
        done = cli(*sweep, "--storage", str(storage), env=without_token(tmp_path))
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        said = re.fullmatch(
            rf"error: --address {re.escape(address)}: nothing accepts a connection there "
            r"\((.+)\); is a Ray cluster's head running at that address and port\?",
            lines[0],
        )
        assert len(lines) == 1 and said and said[1] == (cause or said[1]), lines
        assert not storage.exists()
