"""Faces in a reference photo, for every family that takes one (the photo stack, FlashHead,
LiveAvatar), so that no family reads another's.

`landmarks` runs MediaPipe's BlazeFace and FaceMesh (LiteRT); `finder` finds the faces
FaceMesh confirms and each one's square and roll; `face_box` is a face framed by hand
(X,Y,W,H[,ANGLE]) and its rules; `framing` scales a photo to cover a video and turns a
tilted face upright, as the models take their reference.
"""
