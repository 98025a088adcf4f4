"""Fine-tune a small Llama-style causal LM with Hugging Face's Trainer on JSONL text.

    torchrun --nproc-per-node 2 train.py --data data/train --max-steps 30

The model is built from a config (no download) and the tokenizer is a byte-level BPE trained on the data itself.
It reads SageMaker's SM_CHANNEL_TRAIN (every *.jsonl file in it, one {"text": ...} per line) and writes the model to
SM_MODEL_DIR. On the platform, `PlatformCallback` reports its steps and metrics, checkpoints through the platform
and stops cleanly on a spot interruption; `resume_from` resumes it exactly where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments

try:
    from training.sdk.hf import PlatformCallback, resume_from
except ImportError:  # not on the platform
    PlatformCallback = resume_from = None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("SM_CHANNEL_TRAIN", "data/train"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--output-dir", default=os.environ.get("SM_OUTPUT_DATA_DIR", "output"))
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    return parser.parse_args()


def read_texts(folder: Path) -> list[str]:
    return [
        json.loads(line)["text"] for path in sorted(folder.rglob("*.jsonl")) for line in path.open() if line.strip()
    ]


def tokenizer_for(texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE of 320 tokens learned from the texts (the same on every rank: training it is deterministic)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    learner = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, learner)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")  # noqa: S106


class Blocks(torch.utils.data.Dataset):
    """The texts' tokens, each followed by <eos>, cut into blocks of `size` tokens."""

    def __init__(self, texts: list[str], tokenizer: PreTrainedTokenizerFast, size: int) -> None:
        ids = [i for text in texts for i in [*tokenizer(text)["input_ids"], tokenizer.eos_token_id]]
        self.blocks = torch.tensor(ids[: len(ids) // size * size]).view(-1, size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def main() -> None:
    args = parse()
    torch.set_num_threads(1)  # CPU kernels give the same results run after run
    texts = read_texts(Path(args.data))
    tokenizer = tokenizer_for(texts)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.block_size,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=3,
        logging_steps=1,
        save_strategy="no",  # the platform checkpoints (PlatformCallback)
        report_to=[],
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    platform = PlatformCallback is not None
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Blocks(texts, tokenizer, args.block_size),
        callbacks=[PlatformCallback(checkpoint_steps=args.checkpoint_every)] if platform else [],
    )
    trainer.train(resume_from_checkpoint=resume_from(trainer) if platform else None)
    trainer.save_model(args.model_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.model_dir)


if __name__ == "__main__":
    main()
