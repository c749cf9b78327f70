"""The image job: engine, stand-in base, image build, container checks (see ci/README.md)."""
