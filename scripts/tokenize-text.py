#!/usr/bin/env python3
"""Tokenizes text with a model folder's own tokenizer into the token files `zinf train` reads.

Run with the project's virtual environment (scripts/install-venv.sh makes .venv/ with
transformers and tokenizers):

  .venv/bin/python scripts/tokenize-text.py --model FOLDER --out train.u16 TEXT...
        [--eval-out eval.u16 --eval-fraction 0.05] [--separator '\\n\\n'] [--jsonl-key text]

FOLDER is a Hugging Face model folder holding its tokenizer files (tokenizer.json,
tokenizer_config.json, ...), the folder `zinf train --init-from` takes. Each TEXT file is one
document, or several: --separator cuts a file into documents at each occurrence of a string,
and a `.jsonl` file holds one document per line (the --jsonl-key field). Documents are
tokenized without special tokens and joined with the tokenizer's EOS token, each one followed
by it, as pretraining corpora are packed; `zinf train` then cuts the stream into samples.

--out must end in .u16 (the vocabulary fits 16 bits) or .u32: flat little-endian token ids.
Beside it goes OUT.json, the sidecar `zinf train` checks against the model: the tokenizer's
class, folder and SHA-256 of its files (each and combined), vocabulary size, EOS and BOS ids,
the token and document counts and the inputs. --eval-out receives every round(1 /
--eval-fraction)-th document as held-out data for `zinf train --eval-data`, with its own
sidecar. One streaming pass, a batch of documents at a time (a text file is read whole), so a
corpus larger than memory tokenizes; a progress bar with an ETA on stderr.
"""

import argparse
import datetime
import hashlib
import json
import os
import sys

import numpy as np

# The files of a Hugging Face tokenizer; the ones a folder holds are hashed (zinf train
# computes the same combined hash from --init-from's folder: engine/data/token_sidecar.cc).
TOKENIZER_FILES = ["added_tokens.json", "merges.txt", "special_tokens_map.json", "tokenizer.json",
                   "tokenizer.model", "tokenizer_config.json", "vocab.json"]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_fingerprint(folder):
    """{file: sha256} of the tokenizer files present, and their combined sha256."""
    files = {n: sha256_file(os.path.join(folder, n)) for n in TOKENIZER_FILES
             if os.path.isfile(os.path.join(folder, n))}
    combined = hashlib.sha256("".join(f"{n}\0{h}\n" for n, h in sorted(files.items())).encode())
    return files, combined.hexdigest()


def documents(path, separator, jsonl_key):
    """The documents of one input file, in order."""
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"tokenize: {path}:{number}: not JSON: {e}")
                if not isinstance(record, dict) or not isinstance(record.get(jsonl_key), str):
                    sys.exit(f"tokenize: {path}:{number}: no string field \"{jsonl_key}\" "
                             "(--jsonl-key names it)")
                yield record[jsonl_key]
        return
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            text = f.read()
        except UnicodeDecodeError as e:
            sys.exit(f"tokenize: {path}: not UTF-8 text at byte {e.start}: {e.reason}")
    parts = text.split(separator) if separator else [text]
    for part in parts:
        if part.strip():
            yield part


def write_sidecar(path, body):
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(body, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", metavar="TEXT")
    ap.add_argument("--model", required=True, help="model folder holding the tokenizer files")
    ap.add_argument("--out", required=True, help="token file to write: *.u16 or *.u32")
    ap.add_argument("--eval-out", help="held-out token file (*.u16 or *.u32)")
    ap.add_argument("--eval-fraction", type=float, default=0.05,
                    help="share of the documents held out for --eval-out: every round(1 / "
                         "fraction)-th one (default 0.05: every 20th)")
    ap.add_argument("--separator", default="",
                    help="string that separates documents inside a text file (default: none, "
                         "one document per file); escapes such as \\n are understood")
    ap.add_argument("--jsonl-key", default="text", help="the text field of .jsonl lines")
    ap.add_argument("--batch", type=int, default=256, help="documents per tokenizer call")
    args = ap.parse_args()
    # \n, \t and \\ as escapes; every other character (non-ASCII too) as written.
    separator = (args.separator.replace("\\\\", "\0").replace("\\n", "\n")
                 .replace("\\t", "\t").replace("\0", "\\"))

    for out in filter(None, [args.out, args.eval_out]):
        if not (out.endswith(".u16") or out.endswith(".u32")):
            sys.exit(f"tokenize: {out}: the name must end in .u16 or .u32 (the id width zinf "
                     "train reads it with)")
    if not 0.0 < args.eval_fraction < 1.0:
        sys.exit(f"tokenize: --eval-fraction {args.eval_fraction} must be between 0 and 1")
    for path in args.inputs:
        if not os.path.isfile(path):
            sys.exit(f"tokenize: {path}: no such file")
    files, combined = tokenizer_fingerprint(args.model)
    if not files:
        sys.exit(f"tokenize: {args.model}: holds none of the tokenizer files "
                 f"({', '.join(TOKENIZER_FILES)})")

    # Imported here: transformers takes seconds to import, and the checks above need none of it.
    from tqdm import tqdm
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.model)
    vocab = len(tok)
    eos = tok.eos_token_id
    if eos is None:
        sys.exit(f"tokenize: {args.model}: the tokenizer has no EOS token to join documents with")
    width = 2 if vocab <= 1 << 16 else 4
    for out in filter(None, [args.out, args.eval_out]):
        if out.endswith(".u16") and width == 4:
            sys.exit(f"tokenize: {out}: the vocabulary of {vocab} ids does not fit 16 bits; "
                     "name the file *.u32")

    # One streaming pass: documents are tokenized a batch at a time and appended to the output
    # files, so the corpus never has to fit in memory. Every `every`-th document (the last of
    # each run of `every`) is held out.
    every = max(2, int(round(1.0 / args.eval_fraction))) if args.eval_out else 0
    dtype = np.dtype("<u2" if width == 2 else "<u4")
    outs = {"train": args.out, "held-out": args.eval_out}
    files_out = {role: open(path + ".partial", "wb") for role, path in outs.items() if path}
    counts = {role: 0 for role in files_out}
    docs_in = {role: 0 for role in files_out}
    total_bytes = sum(os.path.getsize(p) for p in args.inputs)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", disable=None,
               file=sys.stderr)
    index = 0

    def flush(batch):
        nonlocal index
        encoded = tok(batch, add_special_tokens=False)["input_ids"]
        for ids in encoded:
            role = "held-out" if every and index % every == every - 1 else "train"
            np.asarray(ids + [eos], dtype=dtype).tofile(files_out[role])
            counts[role] += len(ids) + 1
            docs_in[role] += 1
            index += 1
        bar.update(sum(len(d.encode("utf-8")) for d in batch))

    batch = []
    for path in args.inputs:
        for doc in documents(path, separator, args.jsonl_key):
            batch.append(doc)
            if len(batch) == args.batch:
                flush(batch)
                batch = []
    if batch:
        flush(batch)
    for f in files_out.values():
        f.close()
    if index == 0 or (args.eval_out and (docs_in["held-out"] == 0 or docs_in["train"] == 0)):
        for path in outs.values():
            if path and os.path.exists(path + ".partial"):
                os.remove(path + ".partial")
    if index == 0:
        sys.exit("tokenize: the inputs hold no text")
    if args.eval_out and (docs_in["held-out"] == 0 or docs_in["train"] == 0):
        sys.exit(f"tokenize: {index} document(s) cannot be split into training and held-out "
                 f"data (every {every}th is held out); give more text, --separator to cut files "
                 "into documents, or a larger --eval-fraction")

    tokenizer = {"class": type(tok).__name__, "source": os.path.abspath(args.model),
                 "sha256": combined, "files": files}
    inputs = [{"path": os.path.abspath(p), "bytes": os.path.getsize(p), "sha256": sha256_file(p)}
              for p in args.inputs]
    made = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = []
    for role, out in outs.items():
        if not out:
            continue
        os.replace(out + ".partial", out)
        write_sidecar(out + ".json", {
            "format": "zinf-tokens/1", "tokens": counts[role], "width": width,
            "documents": docs_in[role], "role": role, "vocab_size": vocab, "eos_id": eos,
            "bos_id": tok.bos_token_id, "tokenizer": tokenizer, "inputs": inputs,
            "created": made})
        results.append((out, counts[role], docs_in[role]))
    bar.close()
    for out, count, n in results:
        print(f"{out}: {count} tokens from {n} document(s), {width * 8}-bit ids; sidecar "
              f"{out}.json (tokenizer {type(tok).__name__}, vocab {vocab}, EOS {eos}, "
              f"sha256 {combined[:12]})")


if __name__ == "__main__":
    main()
