"""yolov3: YOLOv3 on Darknet-53."""
