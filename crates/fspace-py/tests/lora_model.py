"""A small GPT-2 with LoRA adapters (transformers + peft, built from a config: nothing is
downloaded), fine-tuned briefly on a generated sequence-classification task — the model of
laplace-torch's HuggingFace recipe, shared by ``test_lora.py`` and
``scripts/compare/lora_laplace.py``.

The task: token sequences over ``vocab`` ids; the label says whether more than half the tokens
come from the lower half of the vocabulary. Batches are dicts (``input_ids``,
``attention_mask``, ``labels``), as a HuggingFace data collator makes them.
"""

import torch


class SequenceClassifier(torch.nn.Module):
    """laplace-torch's wrapper: ``forward(batch)`` takes the dict and returns the logits."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf_model = hf_model

    def forward(self, data):
        return self.hf_model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits


class Sequences(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.mask = torch.ones(n, length, dtype=torch.long)
        self.labels = ((self.ids < vocab // 2).sum(1) > length // 2).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def lora_gpt2(vocab=32, length=8, width=16, layers=2, heads=2, rank=2, seed=0):
    """A float64 GPT-2 classifier whose only trainable weights are LoRA adapters on the
    attention projections and the classification head (peft's ``modules_to_save``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=length, n_embd=width, n_layer=layers, n_head=heads,
                        num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base = GPT2ForSequenceClassification(config)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["c_attn"], lora_dropout=0.0,
                      modules_to_save=["score"])
    return SequenceClassifier(get_peft_model(base, lora)).double()


def fine_tune(model, loader, epochs=5, lr=1e-2):
    """A few epochs of Adam on the trainable (LoRA) weights; returns the last batch's loss."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        for batch in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch), batch["labels"])
            loss.backward()
            opt.step()
    model.eval()
    return float(loss)
