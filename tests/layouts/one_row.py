"""A layout added the way a new one is: this file and one ``register_layout`` row
(tests/trainer/test_learner.py: test_a_new_layout_is_one_file_and_one_row). It cuts as padded rows do and runs the padded forward one row at a time, each row without its padding: the same
numbers as the padded step, which its check (``exact``) confirms on the model before training."""

from __future__ import annotations

import torch

from coati.layouts.padded import PaddedLayout


class OneRowLayout(PaddedLayout):
    name = "one_row"
    forwards = 0  # rows run so far (the test reads it: the run went through this forward)

    def logits(self, model, micro_batch):
        ids, mask = micro_batch["input_ids"], micro_batch["attention_mask"]
        rows = []
        for row, attended in zip(ids, mask.ne(0).sum(dim=1).tolist()):
            logits = model(input_ids=row[:attended].unsqueeze(0)).logits[0]
            rows.append(torch.nn.functional.pad(logits, (0, 0, 0, ids.shape[1] - attended)))  # padding: no loss reads
            OneRowLayout.forwards += 1
        return torch.stack(rows)  # [B, L, V], every position: read as padded rows' full logits

    @staticmethod
    @torch.no_grad()
    def exact(model):
        ids = torch.tensor([[5, 6, 7, 8], [3, 4, 0, 0]])
        micro = {"input_ids": ids, "attention_mask": ids.ne(0).long()}
        was_training = model.training
        model.eval()
        try:
            padded = model(**micro).logits
            alone = OneRowLayout(0).logits(model, micro)
        finally:
            model.train(was_training)
        real = micro["attention_mask"].bool()
        return bool(torch.allclose(alone[real], padded[real], rtol=1e-4, atol=1e-5))
