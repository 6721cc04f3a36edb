"""Compress the Day 4 model after training and measure what each method saves and costs: the size of
the weights, the inference speed on this CPU, and the validation loss.

    python compress_bench.py                                          # train `tiny` briefly on text, then compress
    python compress_bench.py --config small --train-steps 300 --sparsities 0.5 0.9
    python compress_bench.py --config small --checkpoint-dir CKPT     # weights saved by train_llm.py --checkpoint-dir

Variants (compress.py): fp32 (the trained model), int8 dynamic quantisation, 2:4 pruning, unstructured
pruning at each --sparsities. One process, on the CPU (dynamic quantisation's kernels are CPU ones).

Run record (script `compress_bench.py`): `step` lines while training; one `compress` line per variant:
`variant`, `method` (none, quantize_int8, prune_2_4, prune_unstructured), `sparsity` (the zeroed share
asked for, null otherwise), `zero_fraction` (measured among the compressed weights), `size_bytes` (the
state dict as torch.save writes it), `size_bytes_sparse` (pruned weights stored sparse: CSR with int32
indices, or the 2:4 packing; null for dense variants), `tokens_per_s` (inference: forward + loss over the
validation batches, best of --repeats), `val_loss`, `val_loss_increase` (over fp32), `size_ratio`
(size_bytes_sparse or size_bytes over fp32's), `speedup` (tokens/s over fp32's), `note`.
summary.json: `results` (those lines), `baseline_val_loss`, `trained_steps`, `compressed_params`
(weights in the compressed layers), `params`, `threads`. Exit code 2 for bad options.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import torch

from dlokit.in_job.measure import StepClock
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id

from llm_kit import compress
from llm_kit.data import TokenBatches
from llm_kit.model import Llama, get_config, loss_fn

NOTES = {
    "none": "",
    "quantize_int8": "int8 weights, activations quantised at each matmul (torch.ao quantize_dynamic, deprecated "
                     "for torchao's quantize_)",
    "prune_2_4": "dense kernels on the CPU: the zeros are still multiplied; the 2x needs sparse tensor cores "
                 "(Ampere+, torch.sparse.to_sparse_semi_structured)",
    "prune_unstructured": "dense kernels: no speed-up; a sparse format pays only at high sparsity",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tiny", help="tiny, small (the weights must fit one CPU process)")
    p.add_argument("--data", choices=("text", "random"), default="text")
    p.add_argument("--train-steps", type=int, default=200, help="AdamW steps before compressing (0: as initialised)")
    p.add_argument("--checkpoint-dir", default=None, help="load the weights from a train_llm.py checkpoint instead")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sparsities", type=float, nargs="+", default=[0.5, 0.75, 0.9],
                   help="unstructured pruning: share of each layer's weights set to zero")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="timed passes over the validation batches (best kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None)
    args = p.parse_args(argv)
    if not all(0 < s < 1 for s in args.sparsities):
        p.error(f"--sparsities must lie strictly between 0 and 1, got {args.sparsities}")
    for name in ("train_steps", "batch_size", "seq_len", "eval_batches", "repeats"):
        if getattr(args, name) < (0 if name == "train_steps" else 1):
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def train(model, data, args, recorder):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    clock = StepClock(torch.device("cpu"))  # on the CPU every step is split: t_step, the step without its batch
    for step in range(args.train_steps):
        clock.start(step)
        inputs, targets = data.global_batch(step)
        clock.split("data")
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.split("optimizer")
        clock.stop()
        timing = clock.finished()
        recorder.step(epoch=0, step=step + 1, loss=loss.item(), lr=args.lr, batch_size=args.batch_size,
                      t_data=timing.splits["data"], t_step=timing.t_step)
        if (step + 1) % 50 == 0 or step + 1 == args.train_steps:
            print(f"[compress] step {step + 1:4d} loss {loss.item():.4f}", flush=True)


def load_weights(model, folder):
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(folder))  # DCP gathers whatever layout saved it
    model.load_state_dict(state["model"])


@torch.inference_mode()
def evaluate(models, batches, repeats):
    """[(mean validation loss, tokens per second of the fastest pass)] per model. The models take turns,
    pass after pass, so that a change of load on the machine touches them all alike."""
    fastest, losses = [math.inf] * len(models), [None] * len(models)
    for _ in range(repeats):
        for index, model in enumerate(models):
            began = time.perf_counter()
            losses[index] = [loss_fn(model(inputs), targets).item() for inputs, targets in batches]
            fastest[index] = min(fastest[index], time.perf_counter() - began)
    tokens = sum(inputs.numel() for inputs, _ in batches)
    return [(sum(loss) / len(loss), tokens / seconds) for loss, seconds in zip(losses, fastest)]


def variants(model, sparsities):
    """(name, method, sparsity, compressed model, sparse layout of its stored size)."""
    yield "fp32", "none", None, model, None
    yield "int8 dynamic", "quantize_int8", None, compress.quantize_int8(model), None
    yield "2:4", "prune_2_4", 0.5, compress.prune_2_4(model), "2:4"
    for sparsity in sparsities:
        yield f"unstructured {sparsity:.0%}", "prune_unstructured", sparsity, compress.prune_unstructured(model, sparsity), "csr"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = get_config(args.config, max_seq_len=args.seq_len)
    except ValueError as error:
        print(f"compress_bench.py: error: {error}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    model = Llama(config)
    params = sum(p.numel() for p in model.parameters())
    compressed_params = sum(linear.weight.numel() for _, linear in compress.block_linears(model))
    recorder = RunRecorder({**vars(args), "model": config.__dict__, "params": params,
                            "compressed_params": compressed_params}, run_id=shared_run_id(),
                           runs_dir=args.runs_dir, script="compress_bench.py", device=torch.device("cpu"))
    data = TokenBatches(args.data, config.vocab_size, args.batch_size, args.seq_len, seed=args.seed)
    if args.checkpoint_dir:
        load_weights(model, args.checkpoint_dir)
    else:
        train(model, data, args, recorder)
    model.eval()
    batches = [data.global_batch(i, split="val") for i in range(args.eval_batches)]

    results, baseline = [], None
    compressed = list(variants(model, args.sparsities))
    measured = evaluate([variant for _, _, _, variant, _ in compressed], batches, args.repeats)
    for (name, method, sparsity, variant, layout), (val_loss, tokens_per_s) in zip(compressed, measured):
        size = compress.state_dict_bytes(variant.state_dict())
        size_sparse = compress.state_dict_bytes(compress.sparse_state_dict(variant, layout)) if layout else None
        baseline = baseline or {"val_loss": val_loss, "tokens_per_s": tokens_per_s, "size_bytes": size}
        line = {"variant": name, "method": method, "sparsity": sparsity, "zero_fraction": compress.zero_fraction(variant),
                "size_bytes": size, "size_bytes_sparse": size_sparse, "tokens_per_s": tokens_per_s,
                "val_loss": val_loss, "val_loss_increase": val_loss - baseline["val_loss"],
                "size_ratio": (size_sparse or size) / baseline["size_bytes"],
                "speedup": tokens_per_s / baseline["tokens_per_s"], "note": NOTES[method]}
        recorder.log("compress", **line)
        results.append(line)
        print(f"[compress] {name:18s} size {line['size_ratio']:5.2f}x  tokens/s {tokens_per_s:10,.0f} "
              f"({line['speedup']:4.2f}x)  val loss {val_loss:.4f} ({line['val_loss_increase']:+.4f})", flush=True)
    recorder.finish(results=results, baseline_val_loss=baseline["val_loss"],
                    trained_steps=0 if args.checkpoint_dir else args.train_steps, params=params,
                    compressed_params=compressed_params, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
