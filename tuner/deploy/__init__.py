"""Deploy: the winners exported with their sources and prebuilt binaries (`export`, `binaries`),
checked against torch's op where they serve (`serving`), packed as a wheel (`wheel`), loaded as
an op (`load`), put into a model (`patching`), and the shapes a training run calls captured
(`capturing`, `captured`)."""
