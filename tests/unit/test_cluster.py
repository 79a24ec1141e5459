"""Cluster profiles (orchestrator/spec/cluster.py): shipped and user profiles, `extends`, and errors
that name file, line and fix."""

from __future__ import annotations

import pytest

from orchestrator.costmodel.calibration import resolve_efficiency
from orchestrator.errors import ProfileNotFound, SpecError
from orchestrator.spec.cluster import load_profile

from .test_spec_model import write


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ProfileNotFound) as e:
        load_profile("dgx61")
    assert "unknown cluster profile 'dgx61'. Did you mean 'dgx16'?" in str(e.value)
    assert ("Known profiles: dgx-a100-80gb-hdr, dgx-b200, dgx16, gb200-nvl72, gb300-nvl72, hgx-h200-ndr, "
            "local" in str(e.value))


def test_extends_overrides_fields_and_inherits_the_rest():
    h200 = load_profile("hgx-h200-ndr").profile
    dgx = load_profile("dgx16").profile
    assert h200.gpu.memory_gib == 140.4 and h200.nodes == 8
    assert h200.inter_node == dgx.inter_node and h200.slurm == dgx.slurm


def test_user_profile_wins_and_may_extend_the_shipped_one(tmp_path):
    write(tmp_path, "dgx16.yaml", "extends: dgx16\nnodes: 4\ninter_node: {bandwidth_gbps: 200}\n")
    lp = load_profile("dgx16", tmp_path)
    assert lp.source.origin == "user"
    assert lp.profile.nodes == 4
    assert lp.profile.inter_node.bandwidth_gbps == 200
    assert lp.profile.inter_node.nics_per_node == 8  # inherited
    assert lp.profile.gpu.name == "H100-SXM5-80GB"


def test_profile_unknown_key(tmp_path):
    write(tmp_path, "mine.yaml", "extends: dgx16\nnode: 4\n")
    with pytest.raises(SpecError, match=r"mine.yaml:2: unknown key 'node' in the cluster profile; did you mean 'nodes'"):
        load_profile("mine", tmp_path)


def test_extends_cycle(tmp_path):
    write(tmp_path, "a.yaml", "extends: b\n")
    write(tmp_path, "b.yaml", "extends: a\n")
    with pytest.raises(SpecError, match="'extends' forms a cycle: a -> b -> a"):
        load_profile("a", tmp_path)


def test_missing_profiles_dir(tmp_path):
    with pytest.raises(SpecError, match="profiles directory .* does not exist"):
        load_profile("dgx16", tmp_path / "nope")


def test_an_error_in_a_parent_profile_names_the_parents_file_and_line(tmp_path):
    from orchestrator.errors import SpecError
    from orchestrator.spec.cluster import load_profile

    (tmp_path / "parent.yaml").write_text("extends: dgx16\ndescription: mine\ngpu: {memory_gib: -5}\n")
    (tmp_path / "child.yaml").write_text("extends: parent\nnodes: 2\n")
    with pytest.raises(SpecError) as e:
        load_profile("child", tmp_path)
    assert f"{tmp_path / 'parent.yaml'}:3: key 'gpu.memory_gib'" in str(e.value)


def test_a_local_profile_of_several_nodes_is_refused_when_it_loads(tmp_path):
    """The local executor runs one node: two would plan for 8 ranks and start 4 at run time."""
    write(tmp_path, "local-big.yaml", "extends: local\ndescription: mine\nnodes: 2\n")
    with pytest.raises(SpecError) as e:
        load_profile("local-big", tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'local-big.yaml'}:3: key 'nodes' is 2")
    assert "executor: local" in msg and "Set nodes: 1" in msg
    write(tmp_path, "local-big.yaml", "extends: local\ndescription: mine\nnodes: 1\n")
    assert load_profile("local-big", tmp_path).profile.nodes == 1


@pytest.mark.parametrize("line", ["echo 'unclosed", "if true; then", "(cd /tmp"])
def test_a_setup_line_that_is_not_shell_by_itself_names_the_line(tmp_path, line):
    """Each slurm.setup line becomes a line of both generated scripts; `bash -n` judges it alone."""
    import json

    write(tmp_path, "mine.yaml", f"extends: dgx16\nslurm:\n  setup:\n    - module load cuda\n    - {json.dumps(line)}\n")
    with pytest.raises(SpecError) as e:
        load_profile("mine", tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'mine.yaml'}:5: key 'slurm.setup[1]' ({line!r}) is not a complete shell command")
    assert "\n" not in msg
    write(tmp_path, "mine.yaml", "extends: dgx16\nslurm:\n  setup: [module load cuda, \"echo 'it''s fine'\"]\n")
    assert load_profile("mine", tmp_path).profile.slurm.setup[1] == "echo 'it''s fine'"


# NVL72 and B200 profiles (issue 24).
@pytest.mark.parametrize("name, gpus_per_node, domain, hardware", [
    ("gb200-nvl72", 4, 72, "megatron/gb200-nvl72"),
    ("gb300-nvl72", 4, 72, "megatron/gb300-nvl72"),
    ("dgx-b200", 8, 8, "megatron/gb200-nvl72"),
])
def test_blackwell_profiles_load_with_their_nvlink_domain(name, gpus_per_node, domain, hardware):
    """An NVL72 rack is one 72-GPU NVLink domain of 4-GPU trays, of which the shipped profile takes
    16 (64 GPUs); the domain is at most the world (two trays: 8 GPUs). A DGX B200's domain is its
    node. DeepEP is software, off unless the site says so. The B200 shares the GB200 entry's
    efficiencies but has no runs of its own: no interval."""
    p = load_profile(name).profile
    assert p.gpus_per_node == gpus_per_node and p.intra_node.domain_gpus in (None, domain)
    assert p.nvlink_domain == min(domain, p.world_size) == {"dgx-b200": 8}.get(name, 64)
    assert p.resized(nodes=2).nvlink_domain == min(domain, 2 * gpus_per_node)
    assert p.resized(nodes=18).nvlink_domain == p.resized(nodes=64).nvlink_domain == domain
    assert p.features.deepep is False and p.gpu.peak_tflops.fp8 == 2 * p.gpu.peak_tflops.bf16
    r = resolve_efficiency(p)
    assert r.entry == hardware
    assert (r.domain == "fitted") == (name != "dgx-b200"), r.describe()
