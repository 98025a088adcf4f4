"""Model folders and chat records for the fine-tuning tests: the demo's generators (no hub, no download)."""

from localrun.demo.fine_tuning import chat_records, gpt2_folder, llama_folder, write_jsonl, write_tokenizer

__all__ = ["chat_records", "gpt2_folder", "llama_folder", "write_jsonl", "write_tokenizer"]
