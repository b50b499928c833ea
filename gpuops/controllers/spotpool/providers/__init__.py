"""Cloud providers of the spot pool controller: `tencent` (CVM), `aws` (EC2), `webhook` (a JSON contract for
private clouds) and `sim` (the emulated cluster's cloud, which speaks the webhook contract).

The cloud SDKs are an optional extra (`pip install gpuops[cloud]`); a pool naming a provider whose SDK is
missing gets a clear error, the other providers keep working.
"""

from __future__ import annotations

from .base import ErrorKind, Guarded, Provider, ProviderConfig, ProviderError

__all__ = ["PROVIDERS", "make_provider"]

PROVIDERS = ("tencent", "aws", "webhook", "sim")


def make_provider(kind: str, config: ProviderConfig) -> Provider:
    """A provider for `spec.provider`; raises ProviderError (INVALID or CREDENTIALS) when it cannot be built, and
    every later failure of it is a ProviderError too (`Guarded`)."""
    try:
        return Guarded(_build(kind, config))
    except ProviderError:
        raise
    except Exception as e:  # an SDK refusing its configuration in a way nobody foresaw
        raise ProviderError(ErrorKind.INVALID, "ProviderSetupFailed",
                            f"the {kind} provider could not be set up ({type(e).__name__}); check spec.endpoint, "
                            "spec.template.region and the credentials Secret") from None


def _build(kind: str, config: ProviderConfig) -> Provider:
    try:
        if kind == "tencent":
            from .tencent import TencentProvider

            return TencentProvider(config)
        if kind == "aws":
            from .aws import AwsProvider

            return AwsProvider(config)
        if kind in ("webhook", "sim"):
            from .webhook import WebhookProvider

            return WebhookProvider(config, name=kind)
    except ImportError as e:
        raise ProviderError(ErrorKind.INVALID, "SdkMissing",
                            f"the {kind} provider needs an SDK that is not installed ({e.name}); "
                            "install gpuops[cloud]") from None
    raise ProviderError(ErrorKind.INVALID, "UnknownProvider",
                        f"spec.provider {kind!r} is not one of {', '.join(PROVIDERS)}")
