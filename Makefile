# Convenience aliases; ./dev.sh is the real entry point (it works where make is not installed).
.PHONY: demo test
demo:
	./dev.sh demo
test:
	./dev.sh test
