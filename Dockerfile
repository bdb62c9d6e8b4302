# `waste serve` in a container: built in a Rust image, run from a slim Debian one
# with nothing but the binary (the control component is compiled into it). The model
# is not in the image: mount a converted container read-only at /models.
#
#   docker build -t waste .
#   docker run --rm -p 8080:8080 -v /srv/models/m.waste:/models/m.waste:ro \
#       waste /models/m.waste --host 0.0.0.0 --api-key "$KEY" --budget 12G
#
# Nothing is fetched at run time. Not built on the project's CI machines, which
# cannot reach an image registry; docs/DEPLOY.md says what was checked.
FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN cargo build --release -p waste-cli --bin waste

FROM debian:bookworm-slim
RUN useradd --system --no-create-home waste
COPY --from=build /src/target/release/waste /usr/local/bin/waste
USER waste
EXPOSE 8080
# The server listens only once the model is open: an open port is a ready one.
HEALTHCHECK --interval=30s --timeout=5s CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080"]
ENTRYPOINT ["waste", "serve"]
