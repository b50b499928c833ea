# The gpuops operator image: slim Python, non-root, the package and its pinned dependencies only.
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 65532 gpuops \
 && useradd --system --uid 65532 --gid gpuops --home-dir /home/gpuops --create-home gpuops

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY gpuops ./gpuops
# [cloud]: the Tencent Cloud and AWS SDKs of the spot pool providers. [mig]: the webhook's certificates, the
# kubelet device-plugin gRPC API and NVML bindings, so the same image runs `gpuops run` and `gpuops agent`
# (libnvidia-ml itself comes from the host through the NVIDIA container runtime, never from the image).
RUN pip install --no-cache-dir -c constraints.txt "/src[cloud,mig]" \
 && rm -rf /src/build

WORKDIR /home/gpuops
USER 65532:65532
ENTRYPOINT ["gpuops"]
CMD ["--help"]
