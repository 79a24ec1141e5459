"""The documentation site against the code: the generated reference and example outputs are what
scripts/gen_docs.py makes from the code today, every `dsorch` command and every top-level key of a
model spec and of a cluster profile has its page, and the README stays a front door."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import SpecFile

ROOT = Path(__file__).resolve().parents[2]


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return _gen_docs()


@pytest.fixture(scope="module")
def generated(gen):
    return gen.generate()


def _commands(group, ctx):
    yield ctx.command_path
    if isinstance(group, click.Group):
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            yield from _commands(cmd, click.Context(cmd, info_name=name, parent=ctx))


def test_the_committed_reference_and_examples_are_what_the_code_generates(gen, generated):
    """Like a golden file: a change to a command, an option, a schema key or a shown output must
    come with its regenerated page."""
    differ = gen.stale(generated)
    assert not differ, (
        f"{len(differ)} generated docs file(s) differ from the code: {', '.join(differ[:8])}; "
        f"regenerate with `python scripts/gen_docs.py` (or `bash scripts/docs.sh gen`) and commit the result"
    )


def test_every_command_has_a_page_with_every_option(generated):
    paths = list(_commands(main, click.Context(main, info_name="dsorch")))
    assert "dsorch plan" in paths and "dsorch data prepare" in paths
    for path in paths:
        slug = "-".join(path.split()[1:]) or "index"
        page = generated.get(f"docs/reference/cli/{slug}.md")
        assert page is not None, f"{path} has no page"
        assert page.splitlines()[2] == f"# {path}"
    plan = generated["docs/reference/cli/plan.md"]
    for param in next(c for c in main.commands.values() if c.name == "plan").params:
        if isinstance(param, click.Option):
            assert all(f"`{opt}`" in plan for opt in param.opts), param.opts


@pytest.mark.parametrize(("model", "folder"), [(SpecFile, "spec"), (ClusterProfile, "profile")])
def test_every_top_level_key_has_a_page_with_its_type_and_default(generated, model, folder):
    index = generated[f"docs/reference/{folder}/index.md"]
    for name in model.model_fields:
        page = generated.get(f"docs/reference/{folder}/{name}.md")
        assert page is not None, f"{folder} key {name} has no page"
        assert f"# `{name}`" in page and "| type | default |" in page
        assert f"[`{name}`]({name}.md)" in index
    assert "`training.optimizer.lr`" in generated["docs/reference/spec/training.md"]
    assert "`slurm.signal_delay_s`" in generated["docs/reference/profile/slurm.md"]


def test_every_generated_page_is_in_the_nav(generated):
    nav = yaml.safe_load(generated["mkdocs.yml"])["nav"]

    def pages(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from pages(value)
        elif isinstance(item, list):
            for value in item:
                yield from pages(value)

    listed = set(pages(nav))
    for path in generated:
        if path.startswith("docs/reference/"):
            assert path.removeprefix("docs/") in listed, f"{path} is not in mkdocs.yml's nav"
    for page in listed:
        assert (ROOT / "docs" / page).is_file() or f"docs/{page}" in generated, f"nav names a missing page {page}"


def test_the_examples_are_included_by_a_page_and_show_a_plan(generated):
    examples = [p.removeprefix("docs/generated/") for p in generated if p.startswith("docs/generated/")]
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    for name in examples:
        assert f'--8<-- "{name}"' in pages, f"no page includes docs/generated/{name}"
    assert "* chosen: " in generated["docs/generated/plan-llama3-70b-dgx16.txt"]
    assert "does not fit on 2 nodes" in generated["docs/generated/plan-llama3-405b-2-nodes.txt"]


def test_the_readme_is_a_front_door():
    """At most 12,000 bytes; the two quick-start commands .ci/run runs; how to build the site."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12_000, f"README.md is {len(readme.encode()):,} bytes; move detail into docs/"
    ci = (ROOT / ".ci" / "run").read_text()
    for script in ("scripts/quickstart.sh", "scripts/test.sh"):
        assert re.search(rf"^{re.escape(script)}\b", readme, re.M) and script in ci
    assert "bash scripts/docs.sh build" in readme and "bash scripts/docs.sh serve" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


_CITED = re.compile(
    r"`((?:orchestrator|tests|scripts|examples|cluster_profiles|templates|docs)/[\w./-]*\w)(?:::(\w+))?`"
)
# A module named from inside orchestrator/ (`costmodel/pipe_schedule.py`, `plan/rules.py`).
_PACKAGES = "|".join(sorted(p.name for p in (ROOT / "orchestrator").iterdir() if (p / "__init__.py").exists()))
_MODULE = re.compile(rf"`((?:{_PACKAGES})/[\w/]*\w\.(?:py|yaml|json))`")


def test_every_file_the_pages_cite_exists():
    """A page that names `orchestrator/...`, `tests/...::test_x` or `scripts/...` points at a file (and
    test) a clone has: a module moved or a test renamed takes its pages along."""
    # docs/ARCHITECTURE.md has its own test (test_architecture_doc.py); the reference is generated.
    pages = [ROOT / "README.md"]
    pages += [p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts and p.name != "ARCHITECTURE.md"]
    missing = []
    for page in pages:
        for path, test in _CITED.findall(page.read_text()):
            target = ROOT / path
            if not target.exists() or (test and f"def {test}(" not in target.read_text()):
                missing.append(f"{page.relative_to(ROOT)}: {path}{'::' + test if test else ''}")
        for path in _MODULE.findall(page.read_text()):
            if not (ROOT / "orchestrator" / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path} (in orchestrator/)")
    assert not missing, "pages cite what the checkout does not have:\n" + "\n".join(missing)
