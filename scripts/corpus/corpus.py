#!/usr/bin/env python3
"""The text side of scripts/corpus/build-corpus.sh (docs/corpus.md): Python 3.11, stdlib only.

Subcommands (build-corpus.sh calls them in this order; each can be run alone):

  packages [--slice]           the Debian packages a build uses, one a line
  collect OUT --work W ...     extracted packages -> documents: convert (roff, POD, HTML),
                               filter, deduplicate by SHA-256, cap, split validation by
                               document, shuffle, write OUT/text/*.jsonl, OUT/documents.tsv
                               and the text half of OUT/manifest.json
  tokens OUT                   read forge's shards (OUT/<tokenizer>/{train,val}/shard_*.bin),
                               count tokens per document kind, add them to manifest.json
  summary OUT                  OUT/summary.md from manifest.json (and build-info.json)
  check OUT [--compare X]      every invariant of a built corpus (see cmd_check), and that
                               its files match another build's (a directory or a manifest)

Everything written to manifest.json is a function of the package files and the options
alone (no times, hosts or absolute paths), so two builds of the same packages give
byte-identical manifests, text and shards; times go to build-info.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import mmap
import os
import re
import struct
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

MANIFEST_FORMAT = "forge-corpus-v1"
MB = 1_000_000  # sizes given in MB on the command line are decimal megabytes


def die(msg: str) -> None:
    print(f"corpus.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg: str) -> None:
    print(f"corpus: {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Sources: which files of which Debian package become documents, in what format, of what kind.
# A rule's pattern is a regular expression matched (re.fullmatch) against the file's path inside
# the package (no leading "./"), or, for a source with a tarball, against the member's path with
# the tarball's top directory removed. The first matching rule wins.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rule:
    pattern: str
    fmt: str  # text (kept as it is) | roff (man page) | pod (Perl's POD) | html
    kind: str  # prose | code


@dataclasses.dataclass(frozen=True)
class Source:
    package: str
    rules: tuple[Rule, ...]
    in_slice: bool = False  # also used by --slice (small packages only)
    tarball: str | None = None  # regex: a .tar.xz inside the package that holds the files


MAN = r"usr/share/man/man[0-9][^/]*/[^/]+\.[0-9][^/]*\.gz"
SOURCES: tuple[Source, ...] = (
    # The Linux kernel's source tree: Documentation/ (English; translations/ left out) as prose,
    # C sources and headers as code.
    Source("linux-source-6.1", (
        Rule(r"Documentation/(?!translations/).*\.(rst|txt)", "text", "prose"),
        Rule(r".*\.[ch]", "text", "code"),
    ), tarball=r"usr/src/linux-source-[0-9.]+\.tar\.xz"),
    # The Linux man-pages project (sections 1-8; manpages-dev: system calls and libc).
    Source("manpages", (Rule(MAN, "roff", "prose"),), in_slice=True),
    Source("manpages-dev", (Rule(MAN, "roff", "prose"),)),
    # glibc's headers: the slice's code.
    Source("libc6-dev", (Rule(r"usr/include/.*\.h", "text", "code"),), in_slice=True),
    # Python's documentation, as its reStructuredText sources.
    Source("python3.11-doc", (Rule(r"usr/share/doc/python3\.11/html/_sources/.*\.rst\.txt", "text", "prose"),)),
    # Perl's manual (perlfunc, perlre, ...), POD.
    Source("perl-doc", (Rule(r"usr/share/perl/[0-9.]+/pod/.*\.pod", "pod", "prose"),)),
    Source("postgresql-doc-15", (Rule(r"usr/share/doc/postgresql-doc-15/html/.*\.html", "html", "prose"),)),
    # Git's manual pages and guides, AsciiDoc sources.
    Source("git-doc", (Rule(r"usr/share/doc/git-doc/.*\.txt", "text", "prose"),)),
    Source("debian-reference-en", (Rule(r"usr/share/debian-reference/(ch[0-9]+|apa|pr01)\.en\.html", "html", "prose"),)),
    Source("debian-handbook", (Rule(r"usr/share/doc/debian-handbook/html/en-US/[^/]+\.html", "html", "prose"),)),
    Source("debian-policy", (Rule(r"usr/share/doc/debian-policy/policy\.html/_sources/.*\.txt", "text", "prose"),)),
    Source("developers-reference", (Rule(r"usr/share/developers-reference/_sources/.*\.txt", "text", "prose"),)),
    Source("python-django-doc", (Rule(r"usr/share/doc/python-django-doc/html/"
                                      r"(ref|releases|topics|howto|internals|intro|faq|misc)/.*\.html", "html", "prose"),)),
    # Vim's help files (plain text).
    Source("vim-runtime", (Rule(r"usr/share/vim/vim[0-9]+/doc/.*\.txt", "text", "prose"),)),
    # The Rust books (not the API reference, which is generated from code).
    Source("rust-doc", (Rule(r"usr/share/doc/rust-doc/html/(book|reference|nomicon|embedded-book|rustc|edition-guide)/"
                             r"(?!.*print\.html$).*\.html", "html", "prose"),)),
    Source("apache2-doc", (Rule(r"usr/share/doc/apache2-doc/manual/en/.*\.html", "html", "prose"),)),
    Source("cmake-doc", (Rule(r"usr/share/doc/cmake-data/html/_sources/.*\.rst\.txt", "text", "prose"),)),
    # LLVM's and Clang's documentation, their reStructuredText/Markdown sources (AMDGPU/: generated
    # instruction tables, left out).
    Source("llvm-15-doc", (Rule(r"usr/share/doc/llvm-15-doc/html/_sources/(?!AMDGPU/).*\.txt", "text", "prose"),)),
    Source("clang-15-doc", (Rule(r"usr/share/doc/clang-15/html/_sources/.*\.txt", "text", "prose"),)),
    # Node.js's API documentation, Markdown.
    Source("nodejs-doc", (Rule(r"usr/share/doc/nodejs/api/.*\.md\.gz", "text", "prose"),)),
    Source("sqlite3-doc", (Rule(r"usr/share/doc/sqlite3/.*\.html", "html", "prose"),)),
    # OpenSSL's library manual, Tcl's manual, systemd's man pages (roff).
    Source("libssl-doc", (Rule(MAN, "roff", "prose"),)),
    Source("tcl8.6-doc", (Rule(MAN, "roff", "prose"),)),
    Source("systemd", (Rule(MAN, "roff", "prose"),)),
    Source("zsh-doc", (Rule(r"usr/share/doc/zsh-common/html/.*\.html", "html", "prose"),)),
    Source("postfix-doc", (Rule(r"usr/share/doc/postfix/html/.*\.html", "html", "prose"),)),
    # BIND's administrator reference manual (not the index and search pages).
    Source("bind9-doc", (Rule(r"usr/share/doc/bind9-doc/arm/(?!genindex|search)[^/]+\.html", "html", "prose"),)),
)


def sources_for(slice_mode: bool) -> list[Source]:
    return [s for s in SOURCES if s.in_slice or not slice_mode]


from convert import Skip, html_to_text, pod_to_text, roff_to_text  # noqa: E402

CONVERTERS = {"text": lambda s: s, "roff": roff_to_text, "pod": pod_to_text, "html": html_to_text}


# --------------------------------------------------------------------------------------------
# collect: packages -> documents -> jsonl
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Doc:
    sha: str
    source: str  # "<package>:<path>"
    package: str
    kind: str
    data: bytes  # the text, UTF-8


class Collector:
    """Reads every file a source's rules match, converts it and keeps one document per
    distinct SHA-256 (the one whose source sorts first, so the winner does not depend on the
    order files are read in)."""

    def __init__(self, max_file_bytes: int, min_doc_bytes: int) -> None:
        self.max_file_bytes = max_file_bytes
        self.min_doc_bytes = min_doc_bytes
        self.docs: dict[str, Doc] = {}
        self.stats: dict[str, dict] = {}

    def stat(self, package: str) -> dict:
        return self.stats.setdefault(package, {
            "files_matched": 0, "skipped": defaultdict(int), "candidates": 0, "candidate_bytes": 0})

    def add(self, package: str, path: str, rule: Rule, raw: bytes) -> None:
        st = self.stat(package)
        st["files_matched"] += 1
        if path.endswith(".gz"):
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError):
                st["skipped"]["bad_gzip"] += 1
                return
        if len(raw) > self.max_file_bytes:
            st["skipped"]["too_large"] += 1
            return
        if b"\0" in raw:
            st["skipped"]["binary"] += 1
            return
        try:
            src = raw.decode("utf-8")
        except UnicodeDecodeError:
            st["skipped"]["not_utf8"] += 1
            return
        try:
            text = CONVERTERS[rule.fmt](src)
        except Skip as e:
            st["skipped"][str(e)] += 1
            return
        if not text.strip():
            st["skipped"]["empty"] += 1
            return
        data = text.encode("utf-8")
        if len(data) < self.min_doc_bytes:  # redirect stubs ("This page has moved to ..."), one-liners
            st["skipped"]["tiny"] += 1
            return
        sha = hashlib.sha256(data).hexdigest()
        st["candidates"] += 1
        st["candidate_bytes"] += len(data)
        doc = Doc(sha, f"{package}:{path}", package, rule.kind, data)
        old = self.docs.get(sha)
        if old is None or doc.source < old.source:
            self.docs[sha] = doc


def match_rule(rules: tuple[Rule, ...], path: str) -> Rule | None:
    for r in rules:
        if re.fullmatch(r.pattern, path):
            return r
    return None


def walk_package(col: Collector, src: Source, root: Path) -> None:
    """The files of an extracted package (dpkg-deb -x) that the source's rules match; for a
    source with a tarball, the members of that tarball, read as a stream (not unpacked)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            full = Path(dirpath) / fn
            files.append((full.relative_to(root).as_posix(), full))
    if src.tarball:
        tars = [full for rel, full in files if re.fullmatch(src.tarball, rel)]
        if len(tars) != 1:
            die(f"{src.package}: expected one tarball matching {src.tarball!r} in {root}, found {len(tars)}; "
                f"has the package's layout changed? (update SOURCES in {__file__})")
        log(f"{src.package}: reading {tars[0].name} (a stream; the tree is not unpacked to disk)")
        with tarfile.open(tars[0], "r|*") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                path = m.name.split("/", 1)[1] if "/" in m.name else m.name
                rule = match_rule(src.rules, path)
                if rule is None:
                    continue
                st = col.stat(src.package)
                if m.size > col.max_file_bytes:
                    st["files_matched"] += 1
                    st["skipped"]["too_large"] += 1
                    continue
                col.add(src.package, path, rule, tar.extractfile(m).read())
        return
    for rel, full in files:
        rule = match_rule(src.rules, rel)
        if rule is None:
            continue
        if full.is_symlink():
            st = col.stat(src.package)
            st["files_matched"] += 1
            st["skipped"]["symlink"] += 1
            continue
        col.add(src.package, rel, rule, full.read_bytes())


def read_debs(path: Path) -> dict[str, dict]:
    """debs.tsv (written by build-corpus.sh's fetch step): package, version, file, sha256, bytes."""
    out = {}
    for line in path.read_text().splitlines():
        pkg, version, fname, sha, size = line.split("\t")
        out[pkg] = {"package": pkg, "version": version, "deb": fname, "deb_sha256": sha, "deb_bytes": int(size)}
    return out


def in_validation(sha: str, nbytes: int, modulus: int, max_bytes: int) -> bool:
    """The split: validation iff int(sha256, 16) % modulus == 0 and the text is at most max_bytes."""
    return int(sha, 16) % modulus == 0 and nbytes <= max_bytes


def shuffle_key(seed: str, sha: str) -> str:
    return hashlib.sha256(f"{seed}:{sha}".encode()).hexdigest()


def cmd_collect(a: argparse.Namespace) -> None:
    out = Path(a.out)
    work = Path(a.work)
    debs = read_debs(Path(a.debs))
    sources = sources_for(a.slice is not None)
    col = Collector(int(a.max_file_mb * MB), a.min_doc_bytes)
    for src in sources:
        if src.package not in debs:
            die(f"{src.package} is not in {a.debs}: the fetch step did not get it (rerun build-corpus.sh)")
        t0 = time.time()
        walk_package(col, src, work / src.package)
        st = col.stat(src.package)
        log(f"{src.package}: {st['files_matched']} files matched, {st['candidates']} documents "
            f"({st['candidate_bytes'] / MB:.1f} MB), skipped {dict(st['skipped'])} in {time.time() - t0:.1f} s")

    candidates = sum(s["candidates"] for s in col.stats.values())
    docs = list(col.docs.values())
    duplicates = candidates - len(docs)
    # Caps: --code-mb keeps the code documents of the smallest hashes up to that many bytes (an
    # unbiased sample, the same on every run); --slice keeps all documents that way up to its size.
    capped: dict[str, int] = defaultdict(int)
    docs.sort(key=lambda d: d.sha)

    def cap(pool: list[Doc], limit: int) -> set[str]:
        kept, total = set(), 0
        for d in pool:
            if total + len(d.data) <= limit:
                kept.add(d.sha)
                total += len(d.data)
            else:
                capped[d.package] += 1
        return kept

    if a.code_mb is not None:
        keep = cap([d for d in docs if d.kind == "code"], int(a.code_mb * MB))
        docs = [d for d in docs if d.kind != "code" or d.sha in keep]
    if a.slice is not None:
        keep = cap(docs, int(a.slice * MB))
        docs = [d for d in docs if d.sha in keep]

    # Validation: a sample of the documents by hash, without the long ones (more than --val-max-kb):
    # in a few hundred documents one long file (a table-heavy manual, a generated header) would be
    # most of the validation tokens, and the loss on it says little of the corpus (Note in docs/corpus.md).
    val_max = int(a.val_max_kb * 1024)
    val = [d for d in docs if in_validation(d.sha, len(d.data), a.val_modulus, val_max)]
    train = [d for d in docs if not in_validation(d.sha, len(d.data), a.val_modulus, val_max)]
    train.sort(key=lambda d: shuffle_key(a.seed, d.sha))
    val.sort(key=lambda d: shuffle_key(a.seed, d.sha))
    if not train or not val:
        die(f"{len(train)} training and {len(val)} validation documents: both must be non-empty "
            f"(a larger --slice, or a smaller --val-modulus)")

    text_dir = out / "text"
    text_dir.mkdir(parents=True, exist_ok=True)
    index_rows: list[str] = []
    text_files: list[dict] = []

    def write_split(name_of, split: str, pool: list[Doc], max_bytes: int | None) -> None:
        idx, f, nbytes, ndocs, line = 0, None, 0, 0, 0
        path = None

        def close() -> None:
            if f is not None:
                f.close()
                text_files.append({"path": path.relative_to(out).as_posix(), "split": split,
                                   "documents": ndocs, "bytes": nbytes})

        for d in pool:
            rec = (json.dumps({"text": d.data.decode("utf-8"), "source": d.source}, ensure_ascii=False)
                   + "\n").encode("utf-8")
            if f is None or (max_bytes is not None and nbytes + len(rec) > max_bytes and ndocs > 0):
                close()
                path = text_dir / name_of(idx)
                f = open(path, "wb")
                idx, nbytes, ndocs, line = idx + 1, 0, 0, 0
            f.write(rec)
            nbytes += len(rec)
            ndocs += 1
            line += 1
            src = d.source.replace("\t", " ").replace("\n", " ")
            index_rows.append(f"{d.sha}\t{split}\t{path.name}\t{line}\t{d.kind}\t{len(d.data)}\t{src}\n")
        close()

    write_split(lambda i: f"train_{i:03d}.jsonl", "train", train, int(a.train_file_mb * MB))
    write_split(lambda i: "val.jsonl", "val", val, None)
    (out / "documents.tsv").write_text(
        "sha256\tsplit\tfile\tline\tkind\tbytes\tsource\n" + "".join(index_rows), encoding="utf-8")
    for tf in text_files:
        tf["sha256"] = sha256_file(out / tf["path"])

    # Per package: what was read, skipped, dropped as a duplicate or by a cap, and kept.
    kept_by_pkg: dict[str, dict] = defaultdict(lambda: {"documents": 0, "bytes": 0, "prose_bytes": 0, "code_bytes": 0})
    for d in docs:
        k = kept_by_pkg[d.package]
        k["documents"] += 1
        k["bytes"] += len(d.data)
        k[f"{d.kind}_bytes"] += len(d.data)
    winners: dict[str, int] = defaultdict(int)
    for d in col.docs.values():
        winners[d.package] += 1
    packages = []
    for src in sources:
        st = col.stats.get(src.package, col.stat(src.package))
        pk = dict(debs[src.package])
        pk.update({
            "rules": [dataclasses.asdict(r) for r in src.rules],
            "tarball": src.tarball,
            "files_matched": st["files_matched"],
            "skipped": dict(sorted(st["skipped"].items())),
            "candidates": st["candidates"],
            "duplicates_dropped": st["candidates"] - winners[src.package],
            "capped_out": capped[src.package],
        })
        pk.update(kept_by_pkg[src.package])
        packages.append(pk)

    def split_stats(pool: list[Doc]) -> dict:
        return {"documents": len(pool), "bytes": sum(len(d.data) for d in pool),
                "prose_documents": sum(d.kind == "prose" for d in pool),
                "prose_bytes": sum(len(d.data) for d in pool if d.kind == "prose"),
                "code_bytes": sum(len(d.data) for d in pool if d.kind == "code")}

    manifest = {
        "format": MANIFEST_FORMAT,
        "mode": "slice" if a.slice is not None else "full",
        "options": {"slice_mb": a.slice, "code_mb": a.code_mb, "max_file_mb": a.max_file_mb,
                    "min_doc_bytes": a.min_doc_bytes,
                    "train_file_mb": a.train_file_mb, "val_modulus": a.val_modulus, "val_max_kb": a.val_max_kb,
                    "shuffle_seed": a.seed},
        "notes": {
            "bytes": "bytes of the documents' text in UTF-8 (the JSON Lines files are larger: JSON escapes)",
            "dedup": "exact SHA-256 of a document's text; of equal documents the one whose source sorts first is kept",
            "val": f"a document is in validation when int(sha256, 16) % {a.val_modulus} == 0 and its text is at "
                   f"most {a.val_max_kb:g} KiB",
            "shuffle": f"training documents ordered by sha256(\"{a.seed}:\" + the document's sha256)",
            "utf8": "files that are not valid UTF-8 are skipped (not decoded with replacement)",
        },
        "packages": packages,
        "documents": {
            "candidates": candidates,
            "duplicates_dropped": duplicates,
            "capped_out": sum(capped.values()),
            "kept": len(docs),
            "train": split_stats(train),
            "val": split_stats(val),
        },
        "index": {"path": "documents.tsv", "bytes": (out / "documents.tsv").stat().st_size,
                  "sha256": sha256_file(out / "documents.tsv")},
        "text_files": text_files,
        "tokenizers": {},
    }
    write_manifest(out, manifest)
    log(f"{candidates} documents, {duplicates} duplicates dropped, {sum(capped.values())} over a cap; "
        f"train {len(train)} documents ({manifest['documents']['train']['bytes'] / MB:.1f} MB) in "
        f"{sum(1 for t in text_files if t['split'] == 'train')} file(s), val {len(val)} "
        f"({manifest['documents']['val']['bytes'] / MB:.2f} MB)")


def write_manifest(out: Path, manifest: dict) -> None:
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    tmp.replace(out / "manifest.json")


def load_manifest(path: Path) -> dict:
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        die(f"{path} does not exist: build the corpus first (scripts/corpus/build-corpus.sh --out DIR)")
    m = json.loads(path.read_text())
    if m.get("format") != MANIFEST_FORMAT:
        die(f"{path} is not a {MANIFEST_FORMAT} manifest")
    return m


# --------------------------------------------------------------------------------------------
# tokens: forge's shards (src/forge/data/shards.h: "FRGTOK\0\0", u32 version 1, u32 bytes per
# token, u64 count, then the tokens, little-endian)
# --------------------------------------------------------------------------------------------

SHARD_MAGIC = b"FRGTOK\0\0"
SHARD_HEADER = 24


def read_shard_header(path: Path) -> tuple[int, int]:
    """(bytes per token, token count) of a forge shard; dies naming what is wrong."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(SHARD_HEADER)
    if len(head) < SHARD_HEADER or head[:8] != SHARD_MAGIC:
        die(f"{path} is not a forge token shard (no FRGTOK header)")
    version, width, count = struct.unpack("<IIQ", head[8:])
    if version != 1 or width not in (2, 4):
        die(f"{path}: shard version {version}, {width} bytes per token: not what this script reads (version 1)")
    if size != SHARD_HEADER + count * width:
        die(f"{path}: {size} bytes, the header says {SHARD_HEADER + count * width}: truncated or trailing bytes")
    return width, count


def document_tokens(path: Path, ndocs: int) -> tuple[int, list[int], int]:
    """Tokens of each document of a shard written with --eos-token: every document ends with
    the end-of-text token, which is the shard's last token (forge encodes the text with
    encode_ordinary, so the token appears nowhere else). Returns (eos id, tokens per document
    including its end-of-text token, total)."""
    width, count = read_shard_header(path)
    if count == 0:
        die(f"{path} holds no tokens")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        end = SHARD_HEADER + count * width
        eos_bytes = mm[end - width:end]
        eos = int.from_bytes(eos_bytes, "little")
        lengths, start, pos = [], SHARD_HEADER, SHARD_HEADER
        while True:
            pos = mm.find(eos_bytes, pos, end)
            if pos < 0:
                break
            if (pos - SHARD_HEADER) % width:  # a match across two tokens
                pos += 1
                continue
            pos += width
            lengths.append((pos - start) // width)
            start = pos
    if len(lengths) != ndocs:
        die(f"{path}: {len(lengths)} end-of-text tokens ({eos}) for {ndocs} documents; the shard does not match "
            f"its JSON Lines file (re-run the tokenize step: build-corpus.sh --tokenize DIR)")
    return eos, lengths, count


def read_index(out: Path) -> dict[str, list[tuple[str, str, int]]]:
    """documents.tsv by file: [(sha256, kind, bytes)] in line order."""
    by_file: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    with open(out / "documents.tsv", encoding="utf-8") as f:
        next(f)
        for line in f:
            sha, _split, fname, _line, kind, nbytes, _src = line.rstrip("\n").split("\t", 6)
            by_file[fname].append((sha, kind, int(nbytes)))
    return by_file


def cmd_tokens(a: argparse.Namespace) -> None:
    out = Path(a.out)
    m = load_manifest(out)
    by_file = read_index(out)
    toks = {}
    for spec in a.tokenizer:
        name, _, tok_path = spec.partition("=")
        entry = {"tokenizer": Path(tok_path).relative_to(out).as_posix() if Path(tok_path).is_relative_to(out)
                 else Path(tok_path).name,
                 "tokenizer_sha256": sha256_file(Path(tok_path))}
        for split in ("train", "val"):
            files = [t for t in m["text_files"] if t["split"] == split]
            shards = sorted((out / name / split).glob("shard_*.bin"))
            if len(shards) != len(files):
                die(f"{out / name / split}: {len(shards)} shards for {len(files)} JSON Lines files "
                    f"(forge writes one shard per file below 2^28 tokens); re-run the tokenize step")
            tot = {"tokens": 0, "prose_tokens": 0, "code_tokens": 0, "shards": []}
            for tf, sh in zip(files, shards):
                rows = by_file[Path(tf["path"]).name]
                eos, lengths, count = document_tokens(sh, len(rows))
                entry["eos_id"] = eos
                width, _ = read_shard_header(sh)
                entry["bytes_per_token"] = width
                for (sha, kind, _), n in zip(rows, lengths):
                    tot[f"{kind}_tokens"] += n
                tot["tokens"] += count
                tot["shards"].append({"path": sh.relative_to(out).as_posix(), "text_file": tf["path"],
                                      "tokens": count, "bytes": sh.stat().st_size, "sha256": sha256_file(sh)})
            entry[split] = tot
        toks[name] = entry
        log(f"{name}: train {entry['train']['tokens']:,} tokens, val {entry['val']['tokens']:,}")
    m["tokenizers"] = toks
    write_manifest(out, m)


# --------------------------------------------------------------------------------------------
# summary and check
# --------------------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / MB:,.1f}"


def cmd_summary(a: argparse.Namespace) -> None:
    out = Path(a.out)
    m = load_manifest(out)
    info = {}
    if (out / "build-info.json").is_file():
        info = json.loads((out / "build-info.json").read_text())
    d = m["documents"]
    L = [f"# forge corpus ({m['mode']})", ""]
    if info:
        L += [f"Built {info.get('finished', '?')} on {info.get('host', '?')} with {info.get('forge_version', '?')}; "
              f"{info.get('total_seconds', 0):.0f} s in all.", ""]
    L += ["## Sources", "",
          "| package | version | .deb SHA-256 | files | skipped | duplicates | over cap | documents | MB | prose MB | code MB |",
          "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for p in m["packages"]:
        sk = ", ".join(f"{k} {v}" for k, v in p["skipped"].items()) or "-"
        L.append(f"| {p['package']} | {p['version']} | `{p['deb_sha256'][:16]}…` | {p['files_matched']} | {sk} | "
                 f"{p['duplicates_dropped']} | {p['capped_out']} | {p['documents']} | {_mb(p['bytes'])} | "
                 f"{_mb(p['prose_bytes'])} | {_mb(p['code_bytes'])} |")
    L += ["", "## Documents", "",
          f"{d['candidates']:,} candidate documents; {d['duplicates_dropped']:,} exact duplicates dropped; "
          f"{d['capped_out']:,} over a cap (options: {json.dumps(m['options'])}); {d['kept']:,} kept.", "",
          "| split | documents | MB | prose MB | code MB |", "|---|---:|---:|---:|---:|"]
    for s in ("train", "val"):
        x = d[s]
        L.append(f"| {s} | {x['documents']:,} | {_mb(x['bytes'])} | {_mb(x['prose_bytes'])} | {_mb(x['code_bytes'])} |")
    L += ["", "## Tokens", "",
          "Counted from the shards' headers; prose/code by splitting each shard at its end-of-text tokens "
          "(one per document) and adding each document's tokens to its kind.", "",
          "| tokenizer | train tokens | val tokens | total | prose share | bytes/token (train) |",
          "|---|---:|---:|---:|---:|---:|"]
    for name, t in m["tokenizers"].items():
        tot = t["train"]["tokens"] + t["val"]["tokens"]
        prose = t["train"]["prose_tokens"] + t["val"]["prose_tokens"]
        L.append(f"| {name} | {t['train']['tokens']:,} | {t['val']['tokens']:,} | {tot:,} | "
                 f"{100 * prose / max(tot, 1):.1f}% | {d['train']['bytes'] / max(t['train']['tokens'], 1):.2f} |")
    L += ["", "## Files", "", "| file | bytes | SHA-256 |", "|---|---:|---|"]
    for tf in m["text_files"]:
        L.append(f"| {tf['path']} | {tf['bytes']:,} | `{tf['sha256']}` |")
    for name, t in m["tokenizers"].items():
        for s in ("train", "val"):
            for sh in t[s]["shards"]:
                L.append(f"| {sh['path']} | {sh['bytes']:,} | `{sh['sha256']}` |")
    if info.get("steps"):
        L += ["", "## Time", "", "| step | seconds |", "|---|---:|"]
        for k, v in info["steps"].items():
            L.append(f"| {k} | {v:.1f} |")
    (out / "summary.md").write_text("\n".join(L) + "\n")


def manifest_files(m: dict) -> dict[str, tuple[int, str]]:
    """Every file the manifest records: path -> (bytes, sha256)."""
    files = {m["index"]["path"]: (m["index"]["bytes"], m["index"]["sha256"])}
    for tf in m["text_files"]:
        files[tf["path"]] = (tf["bytes"], tf["sha256"])
    for t in m["tokenizers"].values():
        for s in ("train", "val"):
            for sh in t[s]["shards"]:
                files[sh["path"]] = (sh["bytes"], sh["sha256"])
    return files


def cmd_check(a: argparse.Namespace) -> None:
    """Fails (exit 1) naming the first broken invariant:
    - every file the manifest records exists with its size and SHA-256, and the text and shard
      directories hold no other file;
    - every JSON Lines line is {"text", "source"}, its text's SHA-256 is the one documents.tsv
      gives for that line, no document appears twice, and validation and training share none;
    - a document is in validation exactly when int(sha256, 16) % val_modulus == 0 and it is at most
      val_max_kb KiB;
    - the document and byte counts add up to the manifest's;
    - every tokenizer has tokens in both splits, one end-of-text token per document in each shard,
      and at least --min-tokens tokens in all (the first tokenizer is the one --min-tokens counts);
    - with --compare, the same files (path, size, SHA-256) as the other build."""
    out = Path(a.out)
    m = load_manifest(out)
    errors: list[str] = []
    files = manifest_files(m)
    for rel, (size, sha) in files.items():
        p = out / rel
        if not p.is_file():
            errors.append(f"{rel} is missing")
        elif p.stat().st_size != size or sha256_file(p) != sha:
            errors.append(f"{rel}: size or SHA-256 differs from manifest.json")
    for sub in ["text"] + [f"{n}/{s}" for n in m["tokenizers"] for s in ("train", "val")]:
        for p in sorted((out / sub).glob("*")):
            if p.relative_to(out).as_posix() not in files:
                errors.append(f"{p.relative_to(out)} is not in manifest.json")
    if errors:
        die("; ".join(errors[:10]))

    # The text against the index.
    index = read_index(out)
    seen: dict[str, tuple[str, str]] = {}  # sha256 -> (file, split)
    mod = m["options"]["val_modulus"]
    val_max_kb = m["options"].get("val_max_kb", float("inf"))  # (manifests before the option had none)
    val_max = val_max_kb * 1024
    counts = {"train": [0, 0], "val": [0, 0]}
    for tf in m["text_files"]:
        rows = index.get(Path(tf["path"]).name, [])
        n = 0
        with open(out / tf["path"], encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    die(f"{tf['path']}:{n}: not JSON ({e})")
                if set(rec) != {"text", "source"} or not isinstance(rec["text"], str) or not rec["text"].strip():
                    die(f"{tf['path']}:{n}: expected {{\"text\": non-empty string, \"source\": string}}")
                data = rec["text"].encode("utf-8")
                sha = hashlib.sha256(data).hexdigest()
                if n > len(rows) or rows[n - 1][0] != sha:
                    die(f"{tf['path']}:{n}: text's SHA-256 is not the one documents.tsv records for this line")
                if sha in seen:
                    what = "a duplicate" if seen[sha][1] == tf["split"] else "validation and training overlap"
                    die(f"{tf['path']}:{n}: document {sha[:12]} appears twice (also in {seen[sha][0]}): {what}")
                seen[sha] = (tf["path"], tf["split"])
                in_val = in_validation(sha, len(data), mod, val_max)
                if in_val != (tf["split"] == "val"):
                    die(f"{tf['path']}:{n}: document {sha[:12]} is in the wrong split "
                        f"(val iff sha256 % {mod} == 0 and at most {val_max_kb:g} KiB)")
                counts[tf["split"]][0] += 1
                counts[tf["split"]][1] += len(data)
        if n != len(rows) or n != tf["documents"]:
            die(f"{tf['path']}: {n} lines, documents.tsv has {len(rows)}, manifest.json {tf['documents']}")
    for s in ("train", "val"):
        want = (m["documents"][s]["documents"], m["documents"][s]["bytes"])
        if tuple(counts[s]) != want:
            die(f"{s}: {counts[s][0]} documents / {counts[s][1]} bytes in the files, manifest.json says {want}")
        if counts[s][0] == 0:
            die(f"{s}: no documents")

    # The shards.
    if not m["tokenizers"]:
        die("manifest.json records no tokenizer: the tokenize step did not run (build-corpus.sh --tokenize DIR)")
    for name, t in m["tokenizers"].items():
        for s in ("train", "val"):
            if t[s]["tokens"] <= 0:
                die(f"{name} {s}: no tokens")
            for sh in t[s]["shards"]:
                rows = index[Path(sh["text_file"]).name]
                _, lengths, count = document_tokens(out / sh["path"], len(rows))
                if count != sh["tokens"]:
                    die(f"{sh['path']}: {count} tokens, manifest.json says {sh['tokens']}")
    first = next(iter(m["tokenizers"]))
    total = m["tokenizers"][first]["train"]["tokens"] + m["tokenizers"][first]["val"]["tokens"]
    if total < a.min_tokens:
        die(f"{first}: {total:,} tokens, fewer than --min-tokens {a.min_tokens:,}")

    if a.compare:
        om = load_manifest(Path(a.compare))
        other = manifest_files(om)
        if other != files:
            diff = sorted({k for k in set(other) | set(files) if other.get(k) != files.get(k)})
            die(f"the files differ from {a.compare}'s (not reproducible?): {diff[:8]}")
        keys = [k for k in set(om) | set(m) if om.get(k) != m.get(k)]
        if keys:
            die(f"manifest.json differs from {a.compare}'s in {sorted(keys)} (not reproducible?)")
        log(f"identical to {a.compare}: the same manifest, {len(files)} files with the same sizes and SHA-256")
    log(f"check passed: {out} ({counts['train'][0]:,} train / {counts['val'][0]:,} val documents, "
        + ", ".join(f"{n} {t['train']['tokens'] + t['val']['tokens']:,} tokens" for n, t in m["tokenizers"].items())
        + ")")


def cmd_packages(a: argparse.Namespace) -> None:
    for s in sources_for(a.slice):
        print(s.package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("packages", help="the packages a build uses")
    p.add_argument("--slice", action="store_true")
    p = sub.add_parser("collect", help="extracted packages -> jsonl, documents.tsv, manifest.json")
    p.add_argument("out")
    p.add_argument("--work", required=True, help="directory of the extracted packages (WORK/<package>/)")
    p.add_argument("--debs", required=True, help="debs.tsv from the fetch step")
    p.add_argument("--slice", type=float, default=None, help="keep about this many MB of text (small packages only)")
    p.add_argument("--code-mb", type=float, default=None, help="keep at most this many MB of code documents")
    p.add_argument("--max-file-mb", type=float, default=1.0, help="skip files larger than this (default 1)")
    p.add_argument("--min-doc-bytes", type=int, default=64, help="skip documents shorter than this (default 64)")
    p.add_argument("--train-file-mb", type=float, default=100.0, help="largest train_NNN.jsonl (default 100)")
    p.add_argument("--val-modulus", type=int, default=100, help="val iff int(sha256, 16) %% N == 0 (default 100)")
    p.add_argument("--val-max-kb", type=float, default=64.0,
                   help="and the document is at most this many KiB (default 64; longer ones train)")
    p.add_argument("--seed", default="forge-corpus-v1", help="the shuffle's seed")
    p = sub.add_parser("tokens", help="count the shards' tokens into manifest.json")
    p.add_argument("out")
    p.add_argument("--tokenizer", action="append", required=True, help="NAME=tokenizer.json (shards in OUT/NAME/)")
    p = sub.add_parser("summary", help="write summary.md")
    p.add_argument("out")
    p = sub.add_parser("check", help="check a built corpus")
    p.add_argument("out")
    p.add_argument("--compare", help="another build (directory or manifest.json) that must have identical files")
    p.add_argument("--min-tokens", type=int, default=1, help="least tokens of the first tokenizer (default 1)")
    a = ap.parse_args()
    {"packages": cmd_packages, "collect": cmd_collect, "tokens": cmd_tokens, "summary": cmd_summary,
     "check": cmd_check}[a.cmd](a)


if __name__ == "__main__":
    main()
