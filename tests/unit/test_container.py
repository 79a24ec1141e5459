"""A profile's `container` section: its checks (one paragraph naming the file, the key and the fix),
the srun/apptainer words it becomes, spelled as the tools' documentation spells them, in job.sbatch
and in the script `dsorch submit` queues. (The jobs themselves run in tests/system/test_container.py.)"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import SpecError
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.container import ContainerSpec, bind_list, container_argv, env_exports, python_command


def write_profile(d: Path, container: str, name: str = "boxed", extra: str = "") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(f"name: {name}\nextends: dgx16\n{extra}container:\n{container}")
    return p


@pytest.mark.parametrize("container, key, fix", [
    ("  runtime: pyxis\n  image: 'nvcr.io#nvidia/pytorch:24.05-py3; rm -rf ~'\n", "container.image",
     "write an enroot URI"),
    ("  runtime: apptainer\n  image: /i/t.sif\n  mounts: ['/data,/etc:/data']\n", "container.mounts",
     "is not SRC:DST or SRC:DST:FLAGS"),
    ("  runtime: apptainer\n  image: /i/t.sif\n  mounts: ['data:/data']\n", "container.mounts", "an absolute path"),
    ("  runtime: pyxis\n  image: /i/t.sqsh\n  mounts: ['/d:/d:ro;touch x']\n", "container.mounts",
     "FLAGS lower-case words joined by '+'"),
    ("  runtime: pyxis\n  image: /i/t.sqsh\n  workdir: 'relative/dir'\n", "container.workdir", "an absolute path"),
    ("  runtime: pyxis\n  image: /i/t.sqsh\n  env: ['HF_TOKEN=secret']\n", "container.env",
     "list the NAMES of host variables"),
    ("  runtime: apptainer\n  image: /i/t.sif\n  python: 'python3 $(id)'\n", "container.python",
     "is not a command name or path"),
    ("  runtime: pyxis\n  image: /i/t.sqsh\n  command: singularity\n", "container",
     "Pyxis runs through srun: leave `command` out"),
    ("  runtime: docker\n  image: /i/t.sqsh\n", "container.runtime", "'pyxis' or 'apptainer'"),
])
def test_bad_container_values_name_the_file_the_key_and_the_fix(tmp_path, container, key, fix):
    path = write_profile(tmp_path / "profiles", container)
    with pytest.raises(SpecError) as e:
        load_profile("boxed", tmp_path / "profiles")
    msg = str(e.value)
    assert str(path) in msg and f"'{key}'" in msg and fix in msg, msg


def test_a_container_on_the_local_executor_is_refused(tmp_path):
    write_profile(tmp_path / "profiles", "  runtime: pyxis\n  image: /i/t.sqsh\n", extra="executor: local\n")
    with pytest.raises(SpecError, match="the local executor runs processes on this machine, not through srun"):
        load_profile("boxed", tmp_path / "profiles")


FULL = dict(image="/images/train.sqsh", mounts=("/data:/data:ro+rprivate",), workdir="/work", env=("HF_TOKEN", "WANDB_API_KEY"),
            mount_home=False)


def test_pyxis_words_are_spelled_as_pyxis_documents_them():
    # NVIDIA/pyxis README.md (srun --help), @ 1075199:
    #   --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
    #   --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]   Mount flags are separated with "+", e.g. "ro+rprivate"
    #   --container-workdir=PATH
    #   --no-container-mount-home
    #   --container-env=NAME[,NAME...]
    c = ContainerSpec(runtime="pyxis", **FULL)
    srun, prefix = container_argv(c, True, bind_list(c, ["/exp/plan"]), lambda w: w)
    assert prefix == []
    assert srun == [
        "--container-image=/images/train.sqsh",
        "--container-mounts=/data:/data:ro+rprivate,/exp/plan:/exp/plan",
        "--container-workdir=/work",
        "--no-container-mount-home",
        "--container-env=HF_TOKEN,WANDB_API_KEY",
    ]
    assert env_exports(c) == []  # Pyxis takes the names itself
    # An enroot URI's '#' starts a comment in a shell: job.sbatch quotes it.
    uri = ContainerSpec(runtime="pyxis", image="nvcr.io#nvidia/pytorch:24.05-py3")
    assert container_argv(uri, True, "", shlex.quote)[0][0] == "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'"


@pytest.mark.parametrize("command, gpus", [("apptainer", True), ("singularity", False)])
def test_apptainer_words_are_spelled_as_apptainer_exec_documents_them(command, gpus):
    # apptainer-exec(1): "apptainer exec [exec options...] <container> <command>"; "-B, --bind=[] a user-bind
    # path specification. spec has the format src[:dest[:opts]] ... Multiple bind paths can be given by a
    # comma separated list"; --nv (NVIDIA GPU support); --pwd (initial working directory); --no-home.
    # Apptainer user docs (environment_and_metadata.rst): variables set as {ENVPREFIX}ENV_NAME outside the
    # container are set as NAME inside.
    c = ContainerSpec(runtime="apptainer", command=command, **{**FULL, "image": "/images/train.sif", "mounts": ("/data:/data:ro",)})
    srun, prefix = container_argv(c, gpus, bind_list(c, ["/exp/run"]), lambda w: w)
    assert srun == []
    assert prefix == [command, "exec", *(["--nv"] if gpus else []), "--no-home", "--bind",
                      "/data:/data:ro,/exp/run:/exp/run", "--pwd", "/work", "/images/train.sif"]
    env_prefix = "APPTAINERENV_" if command == "apptainer" else "SINGULARITYENV_"
    lines = env_exports(c)
    assert [f'export {env_prefix}HF_TOKEN="$HF_TOKEN"' in ln for ln in lines] == [True, False]
    out = subprocess.run(["bash", "-c", "\n".join([*lines, f"env | grep ^{env_prefix} | sort"])], capture_output=True,
                         text=True, env={"HF_TOKEN": "t0k"}, check=True).stdout
    assert out == f"{env_prefix}HF_TOKEN=t0k\n"  # set on the host: passed in; unset: stays unset
    assert python_command(c, gpus, "/a:/a") == " ".join([*prefix[:-5], "--bind", "/a:/a", *prefix[-3:], "python3"])


def plan_for(runner, tmp_path, container: str, *extra) -> Path:
    write_profile(tmp_path / "profiles", container)
    r = runner.invoke(main, ["plan", str(Path(__file__).parents[2] / "examples" / "llama3-8b.yaml"), "--cluster",
                             "boxed", "--nodes", "2", "--out", "plans/p", *extra],
                      env={"DSORCH_PROFILES_DIR": str(tmp_path / "profiles")})
    assert r.exit_code == 0, r.output
    return Path("plans/p")


@pytest.mark.parametrize("runtime, image, words", [
    ("pyxis", "nvcr.io#nvidia/pytorch:24.05-py3",
     "srun --kill-on-bad-exit=1 --ntasks-per-node=1 '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' "
     "--container-mounts=\"$container_mounts\" bash \"$DSORCH_PLAN_DIR/launch.sh\""),
    ("apptainer", "/images/t.sif",
     "srun --kill-on-bad-exit=1 --ntasks-per-node=1 apptainer exec --nv --bind \"$container_mounts\" /images/t.sif "
     "bash \"$DSORCH_PLAN_DIR/launch.sh\""),
])
@pytest.mark.parametrize("runtime_flag", ["deepspeed", "megatron"])
def test_job_sbatch_runs_the_step_in_the_container_and_the_rest_on_the_host(runner, in_tmp, runtime, image, words,
                                                                            runtime_flag):
    plan = plan_for(runner, in_tmp, f"  runtime: {runtime}\n  image: '{image}'\n  mounts: ['/data:/data']\n",
                    "--runtime", runtime_flag)
    sbatch = (plan / "job.sbatch").read_text()
    assert words in sbatch
    assert subprocess.run(["bash", "-n", str(plan / "job.sbatch")]).returncode == 0
    host, step = sbatch.split(words)
    # On the host, before the step: MASTER_ADDR from scontrol, the bound directories; after it: the requeue.
    assert "scontrol show hostnames" in host and "export MASTER_ADDR" in host and "container_mounts=/data:/data" in host
    assert '$DSORCH_PLAN_DIR:$DSORCH_PLAN_DIR,$DSORCH_RUN_DIR:$DSORCH_RUN_DIR' in host
    assert 'scontrol requeue "$SLURM_JOB_ID"' in step
    assert "container:" in (plan / "plan.yaml").read_text()
    md = (plan / "plan.md").read_text()
    assert f"## Container ({runtime}: `{image}`)" in md and "On the host: the batch script" in md


def test_submit_dry_run_runs_each_task_in_the_container_and_requeues_from_the_host(runner, in_tmp):
    plan_for(runner, in_tmp, "  runtime: pyxis\n  image: /images/t.sqsh\n  python: /opt/venv/bin/python\n")
    r = runner.invoke(main, ["submit", "plans/p", "--dry-run"], env={"DSORCH_PROFILES_DIR": str(in_tmp / "profiles")})
    assert r.exit_code == 0, r.output
    srun = next(ln for ln in r.output.splitlines() if ln.startswith("srun "))
    words = shlex.split(srun)
    assert "--container-image=/images/t.sqsh" in words
    mounts = next(w for w in words if w.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    plan = str((in_tmp / "plans" / "p").resolve())
    assert f"{plan}:{plan}" in mounts and any(m.startswith(str(in_tmp / ".dsorch" / "jobs")) for m in mounts)
    assert words[words.index("-u") - 1] == "/opt/venv/bin/python"  # submitit's `python`: the image's
    teardown = r.output.split("# teardown", 1)[1]
    assert "requeue.request" in teardown and 'scontrol requeue "$SLURM_JOB_ID"' in teardown
    assert 'export DSORCH_MASTER_ADDR="$MASTER_ADDR"' in r.output.split("# command", 1)[0]


def test_in_a_container_rank_0_asks_the_host_for_the_requeue(tmp_path, monkeypatch):
    """submitit's own USR2 handler (SignalHandler.checkpoint_and_try_requeue) runs as ever, but its
    requeue leaves run_dir/requeue.request, which the batch script on the host turns into scontrol."""
    from submitit.core.job_environment import SignalHandler
    from submitit.slurm.slurm import SlurmJobEnvironment

    from orchestrator.plandir.rundir import RunDir
    from orchestrator.run.jobs import _requeue_from_host

    ran = []
    monkeypatch.setattr("subprocess.check_call", lambda *a, **k: ran.append(a))  # scontrol, were it called
    handler = SignalHandler(SlurmJobEnvironment(), None, None)
    _requeue_from_host(handler.checkpoint_and_try_requeue, tmp_path)
    handler.env._requeue(2)
    assert RunDir(tmp_path).requeue_request.exists() and ran == []
