"""Turn text into a dsorch token file (NAME.bin + NAME.json) for ``orchestrator.train --data``.

Installed with the package, so it runs without a checkout (scripts/make_token_file.py is a thin
wrapper kept for the README's and the tests' commands)::

    # the shipped example: Python standard-library docstrings -> examples/data/pydoc.{txt,bin,json}
    python -m orchestrator.train.data.token_file --stdlib-corpus examples/data/pydoc.txt
    python -m orchestrator.train.data.token_file examples/data/pydoc.txt --out examples/data/pydoc

    # your own text (any number of UTF-8 files; each becomes one document):
    python -m orchestrator.train.data.token_file book1.txt book2.txt --out data/books

Tokenizer: bytes (UTF-8 bytes are the token ids, vocabulary 256), which matches
examples/tiny.yaml: a format for the byte-level example and tests. Real text with a real
tokenizer goes through `dsorch data prepare` (Megatron-LM's indexed dataset, NAME.bin + NAME.idx),
which the entrypoint reads as well. Documents are separated by byte 0 (NUL), which ordinary text
never holds. Format (documented in orchestrator/train/data/datasets.py): NAME.bin is the flat
little-endian uint16 array of token ids, no header; NAME.json is {"format": "dsorch-tokens-v1",
"dtype": "uint16", "vocab_size": 256, "num_tokens": N, "tokenizer": "bytes", "sources": [...],
"sha256": ...}.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import sys
from pathlib import Path

import numpy as np

from orchestrator.train.data.datasets import TOKEN_FORMAT as FORMAT

SEPARATOR = 0  # NUL byte between documents

# Modules whose docstrings make the example corpus: English prose about programming, under the
# PSF License that covers the standard library (https://docs.python.org/3/license.html).
STDLIB_MODULES = (
    "collections itertools functools json argparse pathlib re string textwrap logging unittest "
    "subprocess threading datetime decimal fractions statistics random heapq bisect contextlib "
    "dataclasses enum abc io shutil tempfile csv sqlite3 difflib fileinput glob hashlib queue "
    "sched socket struct zipfile tarfile gzip pickle copy pprint inspect tokenize calendar locale "
    "gettext getopt optparse shlex http.client urllib.parse email.message smtplib ftplib "
    "imaplib poplib mailbox mimetypes base64 binascii codecs unicodedata stringprep "
    "reprlib weakref types operator numbers math cmath array selectors asyncio.tasks "
    "asyncio.events concurrent.futures multiprocessing.pool signal mmap ssl secrets hmac uuid "
    "ipaddress xml.dom.minidom xml.etree.ElementTree html.parser webbrowser wave colorsys "
    "cmd code codeop pdb timeit trace tracemalloc warnings traceback atexit gc site sysconfig "
    "zipimport pkgutil modulefinder runpy importlib.util platform errno ctypes curses.ascii "
    "lzma bz2 zlib netrc plistlib configparser tomllib filecmp stat os.path"
).split()


def stdlib_corpus() -> str:
    """The docstrings of STDLIB_MODULES and of their public classes, functions and methods,
    each once, in a fixed order (the output depends only on the Python version)."""
    seen, parts = set(), []

    def add(obj):
        doc = inspect.getdoc(obj)
        if doc and len(doc) > 80 and doc not in seen:
            seen.add(doc)
            parts.append(doc.strip())

    for name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        add(mod)
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            add(obj)
            if inspect.isclass(obj):
                for mname, member in sorted(vars(obj).items()):
                    if not mname.startswith("_"):
                        add(member)
    return "\n\n".join(parts) + "\n"


def tokenize_bytes(texts: list[str]) -> np.ndarray:
    ids = []
    for t in texts:
        ids.append(np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype("<u2"))
        ids.append(np.array([SEPARATOR], dtype="<u2"))
    return np.concatenate(ids[:-1]) if ids else np.zeros(0, dtype="<u2")


def write_token_file(out: Path, tokens: np.ndarray, sources: list[str]) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    data = tokens.astype("<u2").tobytes()
    meta = {
        "format": FORMAT,
        "dtype": "uint16",
        "vocab_size": 256,
        "num_tokens": int(len(tokens)),
        "tokenizer": "bytes",
        "document_separator": SEPARATOR,
        "sources": sources,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    out.with_suffix(".bin").write_bytes(data)
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return meta


def main(argv=None, prog: str = "python -m orchestrator.train.data.token_file") -> int:
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n")[0])
    p.add_argument("texts", nargs="*", type=Path, help="UTF-8 text files, one document each")
    p.add_argument("--out", type=Path, help="output NAME (writes NAME.bin and NAME.json)")
    p.add_argument(
        "--stdlib-corpus", type=Path, metavar="TXT", help="write the standard-library docstring corpus to TXT and stop"
    )
    args = p.parse_args(argv)
    if args.stdlib_corpus:
        text = stdlib_corpus()
        args.stdlib_corpus.parent.mkdir(parents=True, exist_ok=True)
        args.stdlib_corpus.write_text(text, encoding="utf-8")
        print(
            f"wrote {args.stdlib_corpus}: {len(text.encode()):,} bytes from {len(STDLIB_MODULES)} "
            f"modules' docstrings (Python {sys.version.split()[0]})"
        )
        return 0
    if not args.texts or not args.out:
        p.error("give text files and --out NAME (or --stdlib-corpus TXT)")
    texts = [t.read_text(encoding="utf-8") for t in args.texts]
    meta = write_token_file(args.out, tokenize_bytes(texts), [t.name for t in args.texts])
    print(
        f"wrote {args.out.with_suffix('.bin')} and .json: {meta['num_tokens']:,} tokens "
        f"(bytes, vocab 256) from {len(texts)} file(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
