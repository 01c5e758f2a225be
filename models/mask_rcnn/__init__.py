"""mask_rcnn: Mask R-CNN with a ResNet-101-FPN backbone, static shapes."""
