"""The unembedding's cost in float32 and bfloat16 on this CPU: a block of general text times a
vocabulary-by-width matrix, forward, then log_softmax summed and backward into the block (what
a heal's general-text loss runs through a frozen, tied unembedding). Why Gemma-3-270M's heals
run in float32 here (docs/condensation.md, results on Gemma-3-270M).

    python benchmarks/unembedding_dtype.py [--tokens 128] [--threads 1] [--json PATH]
"""
import argparse
import sys
import time

import torch

from condense.artifacts import command_line, write_json

SHAPES = {"smollm2-135m": (49_152, 576), "gemma3-270m": (262_144, 640)}


def measure(vocab, width, dtype, tokens):
    torch.manual_seed(0)
    weight = torch.randn(vocab, width, dtype=dtype)
    x = torch.randn(tokens, width, dtype=dtype, requires_grad=True)
    start = time.perf_counter()
    logits = x @ weight.T
    forward = time.perf_counter() - start
    start = time.perf_counter()
    logits.float().log_softmax(-1).sum().backward()
    return forward, time.perf_counter() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128, help="tokens in the block (random rows of the model's width)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", help="also write the results here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for model, (vocab, width) in SHAPES.items():
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            forward, backward = measure(vocab, width, dtype, args.tokens)
            rows.append(dict(model=model, vocab=vocab, width=width, dtype=name,
                             forward_s=forward, backward_s=backward))
            print(f"{model} ({vocab} x {width}) {name}: forward {forward:.2f} s, "
                  f"backward {backward:.2f} s", flush=True)
    if args.json:
        words = sys.argv[1:] if argv is None else argv
        write_json(args.json, dict(command=command_line("benchmarks/unembedding_dtype.py", words),
                                   tokens=args.tokens, threads=args.threads,
                                   torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
