module libllm/bindings/go

go 1.19
