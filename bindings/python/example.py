"""Streams a story: python3 example.py [model.gguf] [prompt]"""
import os
import sys

import libllm

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("LLM_MODELS_DIR", "."), "stories260K.gguf")
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"

with libllm.Model(path) as model, model.session() as session:
    print(prompt, end="")
    for piece in session.generate(prompt, max_tokens=200, sampling=libllm.Sampling(temperature=0.8, top_p=0.95, seed=42)):
        print(piece.text, end="", flush=True)
    print()
    stats = session.stats()
    print("ttft %.2f ms, %.1f tokens/s" % (stats["ttft_ms"], stats["gen_tokens_per_s"]), file=sys.stderr)
