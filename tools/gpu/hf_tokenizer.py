"""Trains perry's byte-level BPE tokenizer with the Hugging Face `tokenizers` library and writes
tokenizer.json + tokenizer_config.json in the layout transformers and perry both read.

Pipeline = Qwen2/Qwen3's: NFC normalizer, Split(Qwen regex, isolated) then ByteLevel(no prefix
space, no regex), ByteLevel decoder, no BOS. Special tokens <|endoftext|>, <|im_start|>,
<|im_end|> are ids 0, 1, 2 (the trainer puts special tokens first).
"""
import json
import os

import golden_util as gu

SPLIT_DOC = f"\n{gu.EOT}\n"


def read_corpus_docs(train_path, max_bytes=None):
    """Documents of corpus/train.txt (written by tools/corpus/fetch_corpus.sh)."""
    with open(train_path, encoding="utf-8") as f:
        text = f.read()
    docs = [d.strip("\n") for d in text.split(SPLIT_DOC)]
    docs = [d for d in docs if d]
    if max_bytes is not None:
        kept, total = [], 0
        for d in docs:
            kept.append(d)
            total += len(d.encode("utf-8"))
            if total >= max_bytes:
                break
        docs = kept
    for d in docs:
        if gu.EOT in d:
            raise ValueError("a corpus document still contains <|endoftext|>: separator format changed?")
    return docs


def train_tokenizer(docs, vocab_size):
    """Returns a tokenizers.Tokenizer whose JSON pipeline sections equal Qwen3's."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(gu.QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(gu.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))

    # Rewrite the pipeline sections to Qwen3's exact JSON (constructor defaults such as
    # trim_offsets differ between library versions) and mark the added tokens the way Qwen does.
    d = json.loads(tok.to_str())
    d["normalizer"] = gu.QWEN_NORMALIZER
    d["pre_tokenizer"] = gu.QWEN_PRE_TOKENIZER
    d["post_processor"] = gu.QWEN_POST_PROCESSOR
    d["decoder"] = gu.QWEN_DECODER
    for t in d.get("added_tokens", []):
        if t["content"] in gu.SPECIAL_TOKENS:
            t.update(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    tok = Tokenizer.from_str(json.dumps(d, ensure_ascii=False))
    check_tokenizer(tok, docs[:3])
    return tok


def special_ids(tok):
    ids = {}
    for s in gu.SPECIAL_TOKENS:
        i = tok.token_to_id(s)
        if i is None:
            raise ValueError(f"special token {s} missing from the trained tokenizer")
        ids[s] = i
    return ids


def check_tokenizer(tok, sample_docs):
    """Cheap self-checks: specials are single ids, byte-level round trip is lossless."""
    sp = special_ids(tok)
    for s, i in sp.items():
        got = tok.encode(s, add_special_tokens=False).ids
        if got != [i]:
            raise ValueError(f"{s} encodes to {got}, expected [{i}]")
    chat = gu.render_chatml([{"role": "user", "content": "Hi there"}], True)
    ids = tok.encode(chat, add_special_tokens=False).ids
    if ids[0] != sp[gu.IM_START] or sp[gu.IM_END] not in ids:
        raise ValueError(f"ChatML does not encode to special ids: {ids[:8]}")
    samples = ["Hello, world!  Tabs\tand\nnew lines\r\n", "naïve café — “quotes” 1862 ½", "   "]
    samples += [d[:2000] for d in sample_docs]
    for s in samples:
        enc = tok.encode(s, add_special_tokens=False)
        back = tok.decode(enc.ids, skip_special_tokens=False)
        if back != s:
            raise ValueError(f"round trip failed: {s[:40]!r} -> {back[:40]!r}")
    plain = tok.encode("Hello world", add_special_tokens=True).ids
    if plain != tok.encode("Hello world", add_special_tokens=False).ids:
        raise ValueError("add_special_tokens=True adds tokens; perry's tokenizer must add none (no BOS)")


def tokenizer_config(tok, model_max_length):
    sp = special_ids(tok)
    added = {}
    for s in gu.SPECIAL_TOKENS:
        added[str(sp[s])] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": gu.CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": gu.IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": gu.EOT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def save_tokenizer(tok, out_dir, model_max_length=2048):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, model_max_length), f, indent=2, ensure_ascii=False)
        f.write("\n")
    # Reload from disk: what perry and transformers will read must behave the same.
    from tokenizers import Tokenizer

    again = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    probe = "State of the Union, 2021: “We the People” — 1,234.5%"
    if again.encode(probe).ids != tok.encode(probe).ids:
        raise ValueError("tokenizer.json does not reload to the same tokenizer")
    return again


def encode_docs(tok, docs):
    """Token ids of the training stream: each document followed by <|endoftext|>."""
    eot = special_ids(tok)[gu.EOT]
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eot)
    return out
