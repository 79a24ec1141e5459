"""Model specs and cluster profiles: loading, parameter counts, errors that name file, line and fix."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.errors import ProfileNotFound, SpecError
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES, spec_paths


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """\
    name: m
    source: test
    model:
      num_layers: 4
      hidden_size: 64
      ffn_hidden_size: 176
      num_attention_heads: 4
      vocab_size: 256
    training:
      seq_length: 64
      global_batch_size: 16
"""


@pytest.mark.parametrize("path", spec_paths(), ids=lambda p: p.stem)
def test_every_shipped_spec_loads_and_names_its_source(path):
    spec, loaded = load_spec(path)
    assert spec.source.strip()
    assert len(loaded.sha256) == 64
    assert spec.model.num_params > 0


@pytest.mark.parametrize("name, expected", [
    # Llama 3 paper / HF safetensors totals; 405B: 405,853,388,800 (reference/models.yaml).
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),
    ("llama2-7b", 6_738_415_616),
    ("llama2-13b", 13_015_864_320),
    ("llama2-70b", 68_976_648_192),
    ("mistral-7b", 7_241_732_096),
])
def test_parameter_counts_match_published_checkpoints(name, expected):
    spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
    assert spec.model.num_params == expected


def test_gpt3_parameter_count_matches_megatron_eq2():
    # Narayanan et al. 2021, Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), 174.6B for GPT-3.
    spec, _ = load_spec(EXAMPLES / "gpt3-175b.yaml")
    l, h, V, s = 96, 12288, 51200, 2048
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert spec.model.num_params == pytest.approx(eq2, rel=1e-6)


def test_kv_heads_default_to_attention_heads(tmp_path):
    spec, _ = load_spec(write(tmp_path, "m.yaml", GOOD))
    assert spec.model.kv_heads == 4 and not spec.model.gqa


def test_unknown_key_names_file_line_and_valid_keys(tmp_path):
    p = write(tmp_path, "m.yaml", GOOD.replace("ffn_hidden_size", "ffn_hiden_size"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert f"{p}:6: unknown key 'model.ffn_hiden_size'" in msg
    assert "did you mean 'ffn_hidden_size'?" in msg
    assert "valid keys here: num_layers, hidden_size, ffn_hidden_size" in msg


def test_wrong_type_and_range_errors(tmp_path):
    p = write(tmp_path, "m.yaml", GOOD.replace("num_layers: 4", "num_layers: four").replace("vocab_size: 256",
                                                                                              "vocab_size: 0"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert f"{p}:4: key 'model.num_layers'" in msg and "valid integer" in msg
    assert f"{p}:8: key 'model.vocab_size': Input should be greater than 0 (got 0)" in msg


def test_heads_not_dividing_hidden_size(tmp_path):
    p = write(tmp_path, "m.yaml", GOOD.replace("num_attention_heads: 4", "num_attention_heads: 5"))
    with pytest.raises(SpecError, match="hidden_size 64 is not divisible by num_attention_heads 5"):
        load_spec(p)


def test_kv_heads_must_divide_heads(tmp_path):
    p = write(tmp_path, "m.yaml", GOOD.replace("vocab_size: 256", "vocab_size: 256\n      num_kv_heads: 3"))
    with pytest.raises(SpecError, match="num_attention_heads 4 is not divisible by num_kv_heads 3"):
        load_spec(p)


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, "m.yaml", "name: x\nmodel: [1, 2\n")
    with pytest.raises(SpecError, match=rf"{p}:3: malformed YAML"):
        load_spec(p)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


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
