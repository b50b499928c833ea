"""Admission webhooks served by the operator itself: the HTTPS server and its limits, the certificates it
presents, and the caBundle that makes the API server trust them."""
