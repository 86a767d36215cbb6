"""Build: a variant's source rendered from its family's Jinja2 template (`render`), compiled
with nvcc in translation units of several variants and cached by content hash (`compile`), the
CUDA toolkit found (`toolkit`), and the family's torch binding built beside a search (`binding`)."""
