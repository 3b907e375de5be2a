"""Deployment files (images, the agent installer, monitoring) and their scripts; a package only so
that its folders never pass for top-level modules (deploy/docker for the docker SDK) in type checks."""
