"""The ids of a run's prompts: a chat template writes its own special tokens; a plain-text prompt (a base model's
template, or a tokenizer without a chat template) starts as the tokenizer starts any text, BOS included where it
adds one (a base Gemma rambles without it), never with an EOS."""

from __future__ import annotations

from tokenizers import processors

from coati.dataset.rows import Example
from coati.models.tiny import build_char_tokenizer
from coati.rollout.generation import plain_text_start, tokenise_prompts


def bos_tokenizer():
    """The char tokenizer, made to start every text with BOS and end it with EOS as some tokenizers do."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", bos), ("<eos>", eos)])
    return tokenizer


def example(text: str) -> Example:
    return Example(messages=({"role": "user", "content": text},), gt_answer="4")


def test_plain_text_prompts_start_with_the_tokenizers_bos_and_never_end_with_eos():
    tokenizer = bos_tokenizer()
    two = tokenizer("2+2", add_special_tokens=False).input_ids
    assert len(two) == 3 and tokenizer("2+2").input_ids == [tokenizer.bos_token_id, *two, tokenizer.eos_token_id]
    assert plain_text_start(tokenizer) == [tokenizer.bos_token_id]
    [(_, text, ids)], skipped = tokenise_prompts(tokenizer, [example("2+2")], "", 64, "Q: {prompt}\nA:")
    assert text == "Q: 2+2\nA:" and skipped == 0
    assert ids == [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False).input_ids]
    [(_, _, ids)], _ = tokenise_prompts(tokenizer, [example("2+2")], "", 64)  # no template, no chat template
    assert ids == [tokenizer.bos_token_id, *two]


def test_a_chat_template_and_a_tokenizer_without_bos_add_nothing():
    plain = build_char_tokenizer()  # the embedded demo's: its prompts are exactly the row's characters
    assert plain_text_start(plain) == []
    [(_, _, ids)], _ = tokenise_prompts(plain, [example("2+2")], "", 64)
    two = plain("2+2").input_ids
    assert len(two) == 3 and ids == two
    chat = bos_tokenizer()
    chat.chat_template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}="
    [(_, text, ids)], _ = tokenise_prompts(chat, [example("2+2")], "", 64)
    assert text == "<bos>2+2=" and ids == [chat.bos_token_id, *two, *plain("=").input_ids]  # the template's BOS, once
