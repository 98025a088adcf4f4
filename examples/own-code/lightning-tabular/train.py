"""Train a small classifier on a table of points with PyTorch Lightning.

    torchrun --nproc-per-node 2 train.py --data data/train --max-steps 40

It reads SageMaker's SM_CHANNEL_TRAIN (every *.csv file in it: feature columns, then `label`) and writes the model's
weights to SM_MODEL_DIR. On the platform, `PlatformCallback` reports its steps and metrics, checkpoints through the
platform, stops cleanly on a spot interruption and resumes exactly where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import lightning as L  # noqa: N812 - Lightning's own spelling
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from training.sdk.lightning import PlatformCallback
except ModuleNotFoundError as missing:  # not on the platform
    if missing.name != "training":
        raise
    PlatformCallback = None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("SM_CHANNEL_TRAIN", "data/train"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    return parser.parse_args()


def read_points(folder: Path) -> TensorDataset:
    rows = [row for path in sorted(folder.rglob("*.csv")) for row in csv.DictReader(path.open())]
    features = torch.tensor([[float(v) for k, v in row.items() if k != "label"] for row in rows])
    return TensorDataset(features, torch.tensor([int(row["label"]) for row in rows]))


class Classifier(L.LightningModule):
    def __init__(self, features: int, classes: int, lr: float, max_steps: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, classes))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.lr, total_steps=self.hparams.max_steps
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    args = parse()
    torch.set_num_threads(1)  # CPU kernels give the same results run after run
    L.seed_everything(args.seed, verbose=False)
    points = read_points(Path(args.data))
    model = Classifier(points.tensors[0].shape[1], int(points.tensors[1].max()) + 1, args.lr, args.max_steps)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    platform = PlatformCallback is not None
    trainer = L.Trainer(
        accelerator="auto",
        devices=per_node,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // per_node,
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        max_steps=args.max_steps,
        log_every_n_steps=1,
        logger=False,
        enable_checkpointing=not platform,  # on the platform, PlatformCallback checkpoints
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PlatformCallback(checkpoint_steps=args.checkpoint_every)] if platform else [],
    )
    trainer.fit(model, DataLoader(points, batch_size=args.batch_size, shuffle=True))
    if trainer.is_global_zero:
        Path(args.model_dir).mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), Path(args.model_dir) / "model.pt")


if __name__ == "__main__":
    main()
