"""`dsorch data prepare`: text to a Megatron-LM indexed dataset that both runtimes train on."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.cli.common import check_out_path, display_path, make_console


@click.group()
def data():
    """Training data: turn text into the indexed dataset (PREFIX.bin + PREFIX.idx) that
    Megatron-LM's --data-path and the bundled entrypoint both read."""


@data.command(
    epilog="""\b
Examples:
  dsorch data prepare corpus.jsonl --tokenizer tok/tokenizer.json --out data/corpus
  dsorch data prepare books/*.txt --tokenizer tok/ --out data/books --spec examples/llama3-8b.yaml
  dsorch data prepare part-*.parquet --key content --tokenizer tok/tokenizer.json --out data/web --workers 8
Then in the spec: training.data.path: [data/corpus] (or weighted: ["0.3", data/books, "0.7", data/web]).
"""
)
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--tokenizer",
    "tokenizer_path",
    required=True,
    type=click.Path(path_type=Path),
    help="a Hugging Face tokenizer.json (or the directory holding it); read locally, no hub access",
)
@click.option("--out", "prefix", required=True, help="output prefix: writes PREFIX.bin and PREFIX.idx")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "jsonl", "text", "parquet"]),
    default="auto",
    show_default=True,
    help="input format; auto: by suffix (.jsonl/.json, .parquet, anything else plain text)",
)
@click.option("--key", default="text", show_default=True, help="the jsonl key or parquet column holding the text")
@click.option("--per-line", is_flag=True, help="plain text: each non-empty line is a document (default: each file)")
@click.option(
    "--eod-token", default=None, help="end-of-document token (default: <|endoftext|>, <|end_of_text|>, </s>, <eos>)"
)
@click.option("--workers", type=click.IntRange(1, 512), default=1, show_default=True, help="tokenizer processes")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(path_type=Path),
    default=None,
    help="model spec whose vocab_size the tokenizer's vocabulary must not exceed",
)
def prepare(inputs, tokenizer_path, prefix, fmt, key, per_line, eod_token, workers, spec_path):
    """Tokenize jsonl, plain text or parquet files into a Megatron-LM indexed dataset.

    Each document is tokenized, followed by the end-of-document token, and written as one
    document (Megatron-LM's tools/preprocess_data.py with --append-eod); token ids are uint16
    below 65,500 tokens of vocabulary, else int32, as Megatron-LM chooses. The files appear only
    when complete: an interrupted or failed run leaves no PREFIX.bin or PREFIX.idx behind. The
    output is the same for any number of --workers.
    """
    from orchestrator.train.data import prepare as core

    check_out_path(Path(prefix), "--out")
    max_vocab = None
    if spec_path is not None:
        from orchestrator.spec.model import load_spec

        max_vocab = load_spec(spec_path)[0].model.vocab_size
    source = core.Source(paths=tuple(inputs), format=fmt, key=key, per_line=per_line)
    total = sum(p.stat().st_size for p in inputs if p.is_file())
    with _progress(total) as advance:
        done = core.prepare(
            source, tokenizer_path, prefix, eod_token=eod_token, workers=workers, max_vocab=max_vocab, progress=advance
        )
    click.echo(
        f"wrote {display_path(done.bin_path)} and {display_path(done.idx_path)}: {done.documents:,} documents, "
        f"{done.tokens:,} tokens ({done.dtype}; vocabulary {done.vocab_size:,}, end-of-document id {done.eod_id})"
    )
    click.echo(f"train on it with training.data.path: [{prefix}] in the spec, or --data {prefix}")


class _progress:
    """A progress bar over the input's size on stderr, only when stderr is a terminal."""

    def __init__(self, total: int):
        self.total, self.bar = total, None

    def __enter__(self):
        if not sys.stderr.isatty():
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        self.bar = Progress(
            "tokenizing", BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=make_console(stderr=True)
        )
        self.bar.start()
        self.task = self.bar.add_task("tokenizing", total=self.total or None)
        return lambda n: self.bar.advance(self.task, n)

    def __exit__(self, kind, *exc):
        if self.bar is not None:
            if kind is None:  # the bar counts characters read against the files' bytes: end it full
                self.bar.update(self.task, completed=self.total)
            self.bar.stop()
