"""A scripted outside harness for tests/test_gateway.py: the openai client, its own loop.

argv[1] is what it does: answer (two turns, then posts the second reply as its answer), file
(writes it to answer.txt instead), edit (rewrites its first reply before the second turn),
reward (posts its own reward), flood (requests until refused), crash, hang."""

import json
import os
import sys
import time
import urllib.request

import openai

mode = sys.argv[1]
task = json.load(sys.stdin)
if mode == "crash":
    print("harness failed on purpose", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(600)
client = openai.OpenAI(max_retries=0)


def post(path: str, body: dict) -> None:
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                 "Content-Type": "application/json"})
    urllib.request.urlopen(request).read()


messages = list(task["messages"])
if mode == "flood":
    while True:
        try:
            client.chat.completions.create(model="tidal", messages=messages)
        except openai.APIStatusError:
            sys.exit(0)
first = client.chat.completions.create(model="tidal", messages=messages)
reply = first.choices[0].message.model_dump(exclude_none=True)
if mode == "edit":
    reply["content"] = "(edited) " + reply["content"]
messages += [reply, {"role": "user", "content": "Check it, then reply with the final code."}]
second = client.chat.completions.create(model="tidal", messages=messages, stream=mode == "reward")
if mode == "reward":
    text = "".join(chunk.choices[0].delta.content or "" for chunk in second if chunk.choices)
    post("/tidal/reward", {"reward": 0.25, "reason": f"scored {len(text)} chars"})
    sys.exit(0)
answer = second.choices[0].message.content
if mode == "file":
    with open(os.environ["TIDAL_ANSWER_FILE"], "w") as f:
        f.write(answer)
else:
    post("/tidal/answer", {"answer": answer})
