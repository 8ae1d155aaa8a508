"""Chat templates of the offline model kit (Jinja, rendered by ``tokenizer.apply_chat_template``).

``chatml`` — ChatML turns (``<|im_start|>role\\n ... <|im_end|>\\n``), tool schemas in the system turn,
tool calls as ``<tool_call>{json}</tool_call>`` and tool results as ``tool`` turns wrapped in
``<tool_response>``. Assistant reasoning is rendered as ``<think>...</think>`` wherever it appears.

``qwen3`` — the same, but like Qwen3's template it drops the reasoning of assistant turns that come
before the last user turn: rendering rewrites earlier turns, so a later call's sequence is no longer
an extension of an earlier one and the conditioning tree branches there.

In both, ``<|im_end|>`` is the end-of-turn token the model generates (the tokenizer's eos); the
newline after it is a host delimiter the model never produces.
"""

_TOOLS_BLOCK = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)

_ASSISTANT = (
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content and KEEP_REASONING %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n' }}"
    "{%- endif %}"
    "{{- message.content if message.content else '' }}"
    "{%- if message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set fn = tc.function if tc.function is defined else tc %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
)

_BODY = (
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}" + _ASSISTANT +
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATML = _TOOLS_BLOCK + _BODY.replace("KEEP_REASONING", "true")

# Qwen3 keeps reasoning only on assistant turns after the last user turn.
QWEN3 = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    + _TOOLS_BLOCK
    + _BODY.replace("KEEP_REASONING", "loop.index0 > ns.last_user")
)

TEMPLATES = {"chatml": CHATML, "qwen3": QWEN3}

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
]
# Frequent scaffolding strings become single tokens; they are ordinary (non-special) added tokens so
# they survive decoding with skip_special_tokens.
SCAFFOLD_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
