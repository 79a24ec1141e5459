"""Model specs (orchestrator/spec/model.py): loading, parameter counts, errors that name file, line and fix."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.model import load_spec
from orchestrator.spec.training import DataSpec

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


@pytest.mark.parametrize(
    "name, expected",
    [
        # Llama 3 paper / HF safetensors totals; 405B: 405,853,388,800 (reference/models.yaml).
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("mistral-7b", 7_241_732_096),
    ],
)
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
    p = write(
        tmp_path,
        "m.yaml",
        GOOD.replace("num_layers: 4", "num_layers: four").replace("vocab_size: 256", "vocab_size: 0"),
    )
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


@pytest.mark.parametrize(
    "path, blend",
    [
        (None, []),
        (("a",), [(None, "a")]),
        (("a", "b"), [(None, "a"), (None, "b")]),  # even, but "a" is no weight: prefixes alone
        (("30", "a", "70", "b"), [(30.0, "a"), (70.0, "b")]),
    ],
)
def test_blend_reads_data_path_as_megatron_does(path, blend):
    assert DataSpec(path=path).blend() == blend


@pytest.mark.parametrize("path", [("0.3", "a", "0.7", "b", "c"), ("0.3", "a", "b", "c"), ("0", "a", "1", "b")])
def test_a_data_path_megatron_would_misread_is_refused_at_load(path):
    with pytest.raises(ValueError, match="weight prefix pairs"):
        DataSpec(path=path)
