"""Train a small torchvision classifier (ShuffleNetV2 x0.5) with DDP on an ImageFolder of images.

    torchrun --nproc-per-node 2 train.py --data data/train --max-steps 40

A plain PyTorch script: it reads its data from SageMaker's SM_CHANNEL_TRAIN and writes its model to SM_MODEL_DIR.
With the platform's SDK (`--sdk`, the default when it is importable) it reports its steps, checkpoints through the
platform every --checkpoint-every steps and on a stop (a spot interruption), and resumes exactly where it stopped.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - as PyTorch's own examples write it
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, models, transforms

try:
    from training import sdk
except ImportError:  # not on the platform
    sdk = None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("SM_CHANNEL_TRAIN", "data/train"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--sdk", action=argparse.BooleanOptionalAction, default=sdk is not None)
    return parser.parse_args()


def main() -> None:
    args = parse()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else None
    torch.manual_seed(args.seed + rank)
    torch.set_num_threads(1)  # CPU kernels give the same results run after run

    augment = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    dataset = datasets.ImageFolder(args.data, transform=augment)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // args.batch_size
    model = DistributedDataParallel(models.shufflenet_v2_x0_5(num_classes=len(dataset.classes)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.max_steps)

    step = 0
    checkpoints = None
    if args.sdk:
        checkpoints = sdk.Checkpointer(model, optimizer, scheduler)
        step = checkpoints.resume()
    while step < args.max_steps:
        epoch, done = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        # The epoch's order is the sampler's (seeded by epoch); a resumed run starts after the batches it trained.
        order = list(sampler)[done * args.batch_size :]
        # A generator of its own: starting an epoch's loader then draws nothing from the random stream the
        # augmentations use, so a resumed run draws what an uninterrupted one draws.
        batches = DataLoader(dataset, args.batch_size, sampler=order, drop_last=True, generator=torch.Generator())
        for images, labels in batches:
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean = mean.item() / world
            if sdk is not None and args.sdk:
                sdk.report_step(step, loss=mean, lr=lr)
                stop = sdk.should_stop()
                if stop or step % args.checkpoint_every == 0:
                    checkpoints.save(step)
                if stop:
                    return
            elif rank == 0:
                print(f"step {step} loss {mean:.4f}", flush=True)
            if step == args.max_steps:
                break
    if rank == 0:
        Path(args.model_dir).mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), Path(args.model_dir) / "model.pt")
        print(f"trained {step} steps; model written to {args.model_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
