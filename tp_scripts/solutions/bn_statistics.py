"""What SyncBatchNorm computes, on any device (Day 2, TP2.3): the statistics of the global batch.

    torchrun --nproc_per_node=2 bn_statistics.py --channels 4 --batch 8

Each rank holds its share of one global batch of activations (N, C, H, W), and the shares differ, as the images
of different ranks do (rank r's are brighter by r). BatchNorm normalises with the mean and variance of the batch
it sees: each rank with its own. SyncBatchNorm all-reduces, per channel, the element count, the sum and the sum of
squares, so that every rank normalises with the global batch's mean and variance. PyTorch's nn.SyncBatchNorm runs
on GPUs only; this script does its arithmetic with one all-reduce on any backend (gloo on CPU processes). Rank 0
also rebuilds every rank's share and computes the whole batch's statistics in one piece, to compare.

One `bn_statistics` line per rank in metrics.jsonl (its own mean and variance, the synchronised ones, and on rank 0
the whole batch's); the summary holds the largest difference of each from the whole batch's. Run by
notebooks/day2_data_and_ddp.ipynb.
"""
import argparse

import torch
import torch.distributed as dist

from dlokit.in_job import rank as job
from dlokit.in_job.peers import leave_now
from dlokit.in_job.runrecord import RunRecorder, shared_run_id


def main(argv=None) -> int:
    args = parse_args(argv)
    env = job.detect()
    device = job.init_process_group(device="cpu")
    record = RunRecorder(vars(args), rank=env.rank, world_size=env.world_size, run_id=shared_run_id(),
                         runs_dir=args.runs_dir, script="bn_statistics.py", device=device)
    mine = share(env.rank, args)
    local_mean, local_var = local_statistics(mine)
    synced_mean, synced_var = synchronised_statistics(mine)
    line = {"rank": env.rank, "local_mean": local_mean.tolist(), "local_var": local_var.tolist(),
            "synced_mean": synced_mean.tolist(), "synced_var": synced_var.tolist()}
    if env.rank == 0:
        whole_mean, whole_var = local_statistics(torch.cat([share(r, args) for r in range(env.world_size)]))
        line.update(whole_mean=whole_mean.tolist(), whole_var=whole_var.tolist())
        apart = {"synced_vs_whole": largest_difference((synced_mean, synced_var), (whole_mean, whole_var)),
                 "local_vs_whole": largest_difference((local_mean, local_var), (whole_mean, whole_var))}
        print(f"rank 0 of {env.world_size}: largest difference from the whole batch's mean and variance: "
              f"synchronised {apart['synced_vs_whole']:.2e}, its own batch's {apart['local_vs_whole']:.2e}", flush=True)
    record.log("bn_statistics", **line)
    record.finish(**({"largest_difference": apart} if env.rank == 0 else {}))
    job.destroy_process_group()
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bn_statistics.py", description="BatchNorm's statistics: per rank vs global.")
    p.add_argument("--channels", type=int, default=4, help="channels of the activations (one mean and variance each)")
    p.add_argument("--batch", type=int, default=8, help="images per rank")
    p.add_argument("--size", type=int, default=6, help="height and width of each activation map")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="where run records go [default: $DLOKIT_RUNS_DIR or ./runs]")
    return p.parse_args(argv)


def share(rank: int, args) -> torch.Tensor:
    """Rank `rank`'s share of the global batch; any rank can rebuild any share (one seed per rank)."""
    generator = torch.Generator().manual_seed(args.seed + rank)
    return torch.randn(args.batch, args.channels, args.size, args.size, generator=generator) + rank


def local_statistics(x: torch.Tensor):
    """Per channel: what BatchNorm uses in training, the mean and (biased) variance over batch, height, width."""
    return x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)


def synchronised_statistics(x: torch.Tensor):
    """Per channel, the mean and variance of the global batch, from each rank's count, sum and sum of squares."""
    count = torch.full((x.shape[1],), float(x.numel() // x.shape[1]))
    totals = torch.stack([count, x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3))])
    # >>> SOLUTION TP2.3: add up every rank's counts and sums (one all-reduce), as SyncBatchNorm does per layer
    if dist.is_initialized():
        dist.all_reduce(totals)  # SUM by default
    # --- STUDENT
    # pass  # each rank keeps its own: the statistics of its own batch, as plain BatchNorm
    # <<< SOLUTION
    count, total, squares = totals
    mean = total / count
    return mean, squares / count - mean * mean


def largest_difference(statistics, reference) -> float:
    return max((a - b).abs().max().item() for a, b in zip(statistics, reference))


if __name__ == "__main__":
    leave_now(main())  # without the interpreter's teardown: see dlokit.in_job.peers.leave_now
