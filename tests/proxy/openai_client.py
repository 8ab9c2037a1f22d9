"""The official OpenAI SDK inside the sandbox, configured only by the proxy's environment
(OPENAI_BASE_URL, OPENAI_API_KEY): a plain and a streamed chat completion."""

from __future__ import annotations

import json

from openai import OpenAI

client = OpenAI()
messages = [{"role": "user", "content": "What is 6*7?"}]
plain = client.chat.completions.create(model="task-model", messages=messages)
stream = client.chat.completions.create(model="task-model", messages=messages, stream=True)
pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
print(json.dumps({"plain": plain.choices[0].message.content, "stream": pieces}))
