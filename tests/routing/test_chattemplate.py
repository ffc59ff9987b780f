"""Chat templates rendered as transformers renders them (llmgw.routing.chattemplate): the globals and
filters templates call, the forms a template and its special tokens take in tokenizer_config.json."""
from __future__ import annotations

import json

import pytest

from llmgw.routing.chattemplate import ChatTemplate, load_chat_template
from llmgw.routing.kvblocks import load_tokenizer
from llmgw.routing.kvindex import KVIndex
from tests.fixtures import chat_model

# Mistral-style: roles must alternate, else raise_exception (vLLM answers the request 400)
ALTERNATE = ("{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
             "{% endif %}[{{ m['role'] }}]{{ m['content'] | tojson }}{% endfor %}"
             "{% if add_generation_prompt %}[assistant]{% endif %}{{ greeting | default('') }}")


def test_the_template_gets_its_special_tokens_globals_and_the_requests_kwargs(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": "tool_use", "template": "no"}, {"name": "default", "template": ALTERNATE}],
        "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True}}))
    template = load_chat_template(tmp_path)
    assert template is not None
    doc = {"messages": [{"role": "user", "content": "héllo <b>"}]}
    assert template.render(doc) == '<s>[user]"héllo <b>"[assistant]'  # tojson as transformers': not escaped
    assert template.render({**doc, "add_generation_prompt": False,
                            "chat_template_kwargs": {"greeting": "!"}}) == '<s>[user]"héllo <b>"!'
    with pytest.raises(ValueError, match="roles must alternate"):
        template.render({"messages": [{"role": "assistant", "content": "hi"}]})
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}")  # the file wins over the config
    assert load_chat_template(tmp_path).render(doc) == "1"  # type: ignore[union-attr]


def test_generation_blocks_documents_and_a_continued_final_message():
    # SmolLM3-style: the assistant's turns in a {% generation %} block (transformers' tag), the end of turn after
    template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
                            "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}</>{% endfor %}"
                            "{% for d in documents or [] %}[{{ d.title }}]{% endfor %}")
    doc = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]}
    assert template.render(doc) == "<user>hi</><assistant>Sure, </>"
    assert template.render({**doc, "documents": [{"title": "a"}]}).endswith("</>[a]")
    assert template.render({**doc, "continue_final_message": True}) == "<user>hi</><assistant>Sure, "
    with pytest.raises(ValueError, match="final message does not appear"):
        ChatTemplate("{{ messages | length }}").render({**doc, "continue_final_message": True})


def test_a_chat_the_template_refuses_has_no_key_and_a_broken_template_is_refused(tmp_path):
    kv = KVIndex()
    kv.tokenizer, kv.template = load_tokenizer(str(chat_model.write(tmp_path / "m"))), ChatTemplate(ALTERNATE)
    assert kv.token_ids({"messages": [{"role": "assistant", "content": "hi"}]}) == []
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="does not compile"):
        load_chat_template(tmp_path)
    assert load_chat_template(tmp_path / "none") is None
