# Writes a GGUF whose every tensor is the F32 decoding of the input's
# (gguf PyPI package, gguf.quants.dequantize: bit-exact with ggml), metadata
# unchanged. llama.cpp runs such a file with plain f32 math, which makes it
# the oracle of libllm's LLM_LOAD_REFERENCE_MATH on the quantized original.
# usage: python3 dequantize_gguf.py IN.gguf OUT.gguf
import gguf, numpy as np, sys
r = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], arch=None)
for k, f in r.fields.items():
    if k.startswith('GGUF.') or k == 'general.file_type': continue
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        w.add_key_value(k, f.contents(), vt, sub_type=f.types[1])
    else:
        w.add_key_value(k, f.contents(), vt)
for t in r.tensors:
    a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
