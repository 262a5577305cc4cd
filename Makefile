# Two commands do everything on a fresh machine (see README.md):
#   make bench   set up, build, generate sample data, run the loader and training benchmarks
#   make test    set up, build and run the tests
# VENV and REQ choose the environment; `make test-cpu` is the CPU-only build (CPU torch, no CUDA).
PYTHON ?= python3
VENV ?= .venv
REQ ?= requirements/cuda.txt
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup system-deps test bench bench-peers bench-remote-peers test-cpu fuzz rehearse-device clean

# The image decoders' headers (fastpipe.ImageFolder/ImageDataset): libjpeg-turbo, libspng and libwebp,
# installed from Debian's packages as root (or with sudo) when missing; elsewhere the build says which
# decoder is OFF and why (PNG and WebP then go through Pillow). Then, best effort: libjpeg-turbo-progs (its
# cjpeg writes the tests' 4:4:0 and 4:1:1 JPEGs, which Pillow cannot; without it those tests skip) and
# ccache (torch's extension build uses it when installed, as tests/fuzz does: the CPU-only build, a rebuild
# against another torch and `make fuzz` reuse every object whose preprocessed source did not change) and
# nginx (the remote-shard tests start their own on 127.0.0.1; Debian's package starts no server here).
# libcurl's headers: shards from s3:// and http(s):// URLs.
system-deps:
	@pkg-config --exists libjpeg spng libwebp libcurl 2>/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    echo "installing libjpeg62-turbo-dev, libspng-dev, libwebp-dev (image decoding), libcurl4-openssl-dev (remote shards) and pkg-config ..."; \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends libjpeg62-turbo-dev libspng-dev libwebp-dev libcurl4-openssl-dev pkg-config; } >/tmp/fastpipe-apt.log 2>&1 || \
	      { cat /tmp/fastpipe-apt.log >&2; exit 1; }; \
	  else \
	    echo "warning: image decoders' headers not found and no apt-get: the build says which are OFF" >&2; \
	  fi; }
	@MISSING=""; command -v cjpeg >/dev/null || MISSING="$$MISSING libjpeg-turbo-progs"; \
	command -v ccache >/dev/null || MISSING="$$MISSING ccache"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || MISSING="$$MISSING nginx"; \
	[ -z "$$MISSING" ] || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  { command -v apt-get >/dev/null && $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$MISSING; } >/tmp/fastpipe-apt-progs.log 2>&1 || \
	    echo "warning: $$MISSING could not be installed (without cjpeg the 4:4:0 and 4:1:1 JPEG tests skip; without ccache every build compiles everything; without nginx the HTTP shard tests skip)" >&2; }

setup: system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r $(REQ)
	$(PY) -m pip install -q --no-build-isolation -e .
	$(PY) -c "import fastpipe, json; print(json.dumps(fastpipe.build_info()))"

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The loader, train and images suites against stock PyTorch, within their time budgets (5 + 5 + 8 minutes on
# 2 cores, data generation included; benchmarks/README.md). `make bench BENCH_ARGS=--full`: the publication
# run (full sizes and repetitions, about an hour on 2 cores); BENCH_ARGS="--budget-minutes 30": more repetitions.
bench: setup
	$(PY) -m fastpipe.bench all --suites loader,train,images --out-dir benchmarks/results --data-dir benchmarks/data $(BENCH_ARGS)

# The images suite's optional peers (requirements/bench-peers.txt): DALI, and FFCV, which compiles against
# libturbojpeg and OpenCV: their Debian packages are installed first as root (or with sudo) when missing.
# The suite skips a peer that does not import, with the reason.
bench-peers: setup
	@pkg-config --exists libturbojpeg opencv4 2>/dev/null || { \
	  if command -v apt-get >/dev/null; then \
	    echo "installing pkg-config libturbojpeg0-dev libopencv-dev (FFCV's build) ..."; \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends pkg-config libturbojpeg0-dev libopencv-dev; } >/tmp/fastpipe-apt.log 2>&1 || \
	      { cat /tmp/fastpipe-apt.log >&2; exit 1; }; \
	  else \
	    echo "warning: no apt-get: FFCV needs libturbojpeg's and OpenCV's headers and pkg-config files" >&2; \
	  fi; }
	$(PY) -m pip install -r requirements/bench-peers.txt

# The remote benchmark's peers (requirements/bench-remote-peers.txt) in .venv-peers, an environment of their
# own that sees .venv's packages (torch, fastpipe, moto): run `.venv-peers/bin/python
# benchmarks/webdataset_remote.py` (the remote suite); without them it reports those peers as not run.
bench-remote-peers: setup
	@test -x .venv-peers/bin/python || $(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/zz_fastpipe_venv.pth', 'w').write('import site; site.addsitedir(%r)\\n' % sys.argv[1])" \
	  "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')"
	.venv-peers/bin/python -m pip install -q -r requirements/bench-remote-peers.txt
	.venv-peers/bin/python -m pip uninstall -q -y obstore

# The CPU-only build (CPU torch, no CUDA). tests/cpu_torchvision.py: the index's torchvision is a CUDA wheel,
# whose import needs two of its ops declared against a CPU torch (its transforms are what the tests use).
test-cpu:
	$(MAKE) setup VENV=.venv-cpu REQ=requirements/cpu.txt
	.venv-cpu/bin/python tests/cpu_torchvision.py install
	.venv-cpu/bin/python -m pytest -q $(PYTEST_ARGS)

# Bounded libFuzzer run (ASan+UBSan) of the .npy parser, the token-file opener and the JPEG path; installs clang-14.
fuzz: system-deps
	bash tests/fuzz/run.sh

# benchmarks/device_check.sh rehearsed without a GPU, against the GPU machine's torch (2.11.0+cu130).
rehearse-device:
	@test -x .venv-torch211/bin/python || $(PYTHON) -m venv .venv-torch211
	.venv-torch211/bin/python -m pip install -q -r requirements/device-rehearsal.txt
	PYTHON=$(CURDIR)/.venv-torch211/bin/python PACK_DIR=/tmp/fastpipe-device-rehearsal-pack bash benchmarks/device_check.sh "" rehearse

clean:
	rm -rf build fastpipe/*.so *.egg-info
