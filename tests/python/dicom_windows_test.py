"""DICOM windows at every bit depth, checked against an independent reader: pydicom (Debian's
python3-pydicom) writes the files, reads them back, and applies its own modality LUT
(apply_modality_lut: Rescale Slope/Intercept, then Dose Grid Scaling multiplied here, as PS3.3
C.8.8.3 says) and VOI LUT (apply_voi_lut: the window, LINEAR or LINEAR_EXACT); Cohort decodes the
same files through cohort.data.Loader (an eval loader whose resize and crop are the image's own
size, so the resampler passes each pixel through, and whose mean 0 and std 1 leave the windowed
value in [0, 1]). The two must agree within 1.5/65535 (Cohort rounds to 16 bits).

Files: 8 bits stored in 8, 12 and 16 in 16, 32 in 32, unsigned and signed, plain (Secondary
Capture), rescaled (Digital X-Ray: GDCM's reader ignores its rescale, Cohort must not) and RT Dose
grids scaled by Dose Grid Scaling; explicit VR little endian (read in place up to 16 bits),
explicit VR big endian (GDCM's reader) and RLE (pydicom's encoder: up to 16 bits); and pydicom's
own RT Dose test files (32-bit, implicit VR, big endian, RLE; one frame and 15). Each under the
file's own window and under windows given by the caller in modality units (a wide one, one 200
stored steps wide, and for a dose grid one below 1 Gy).

Run: PYTHONPATH=build/python /usr/bin/python3 tests/python/dicom_windows_test.py
"""

import copy
import glob
import os
import shutil
import tempfile
import unittest

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.pixel_data_handlers.util import apply_modality_lut, apply_voi_lut
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, RLELossless, generate_uid

from cohort.data import Loader

SECONDARY_CAPTURE = "1.2.840.10008.5.1.4.1.1.7"
DIGITAL_XRAY = "1.2.840.10008.5.1.4.1.1.1.1"
RT_DOSE = "1.2.840.10008.5.1.4.1.1.481.2"
SIDE = 32
TOLERANCE = 1.5 / 65535
PYDICOM_FILES = os.path.join(os.path.dirname(pydicom.__file__), "data", "test_files")


def stored_values(bits, signed):
    """SIDE*SIDE stored values: half spread over the whole range (both ends), half a run of
    consecutive values around 37% of it (where the narrow window goes)."""
    lo = -(1 << (bits - 1)) if signed else 0
    hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    n = SIDE * SIDE
    spread = [lo + (hi - lo) * i // (n // 2 - 1) for i in range(n // 2)]
    around = lo + int(0.37 * (hi - lo))
    run = [min(max(around + i - n // 4, lo), hi) for i in range(n // 2)]
    return np.array(spread + run, dtype=np.int64).reshape(SIDE, SIDE), around


def write(path, values, allocated, stored, signed, kind, syntax):
    """A file written by pydicom; returns the (center, width) of the file's own window."""
    meta = FileMetaDataset()
    sop = {"plain": SECONDARY_CAPTURE, "rescaled": DIGITAL_XRAY, "dose": RT_DOSE}[kind]
    meta.MediaStorageSOPClassUID = sop
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.is_little_endian = True
    ds.is_implicit_VR = False
    ds.SOPClassUID = sop
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Rows = ds.Columns = SIDE
    ds.SamplesPerPixel = 1
    # MONOCHROME1 (displayed inverted) once at every depth
    ds.PhotometricInterpretation = "MONOCHROME1" if kind == "rescaled" and signed else \
        "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = allocated, stored, stored - 1
    ds.PixelRepresentation = 1 if signed else 0
    slope, intercept = 1.0, 0.0
    if kind == "rescaled":
        slope, intercept = (2.5e-4 if allocated == 32 else 0.75), -1024.5
        ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
    elif kind == "dose":
        slope = 3.0e-8 if allocated == 32 else 1.5e-3  # Gy per stored step
        ds.Modality, ds.DoseUnits, ds.DoseType, ds.DoseSummationType = \
            "RTDOSE", "GY", "PHYSICAL", "PLAN"
        ds.DoseGridScaling = slope
    ends = [values.min() * slope + intercept, values.max() * slope + intercept]
    lo, span = min(ends), abs(ends[1] - ends[0])
    center, width = float(f"{lo + 0.6 * span:.10g}"), float(f"{0.5 * span:.10g}")
    ds.WindowCenter, ds.WindowWidth = center, width
    if width < 1:  # LINEAR needs a width of 1 or more (PS3.3 C.11.2.1.2.1)
        ds.VOILUTFunction = "LINEAR_EXACT"
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[allocated]
    raw = (values & ((1 << stored) - 1)).astype(dtype)  # two's complement in `stored` bits
    if signed and stored < allocated:  # sign-extended to the bits allocated, as writers store it
        raw = values.astype({8: np.int8, 16: np.int16}[allocated]).view(dtype)
    if syntax == "big endian":
        ds.is_little_endian = False
        meta.TransferSyntaxUID = ExplicitVRBigEndian
        ds.PixelData = raw.astype(raw.dtype.newbyteorder(">")).tobytes()
    else:
        ds.PixelData = raw.tobytes()
        if syntax == "RLE":
            ds.compress(RLELossless)
    ds.save_as(path, write_like_original=False)
    return center, width


def expected(ds, window):
    """pydicom's windowed values in [0, 1] (MONOCHROME1 inverted) of the first frame, under the
    file's window (None) or (center, width) in modality units."""
    stored = ds.pixel_array
    if getattr(ds, "NumberOfFrames", 1) > 1:
        stored = stored[0]
    modality = apply_modality_lut(stored, ds).astype(np.float64)
    voi = copy.deepcopy(ds)
    if "DoseGridScaling" in ds:
        modality = modality * float(ds.DoseGridScaling)
    if window is not None:
        voi.WindowCenter, voi.WindowWidth = window
        voi.VOILUTFunction = "LINEAR_EXACT" if window[1] < 1 else "LINEAR"
    # The output range as pydicom scales it: the values below and above every window.
    y = apply_voi_lut(np.concatenate([modality.ravel(), [-1e300, 1e300]]), voi)
    y = (y[:-2] - y[-2]) / (y[-1] - y[-2])
    if ds.PhotometricInterpretation == "MONOCHROME1":
        y = 1 - y
    return y.reshape(stored.shape)


def decoded(folder, side, window):
    loader = Loader(folder, batch_size=1, image_size=side, workers=1, seed=0, train=False,
                    resize=side, mean=(0.0,), std=(1.0,), window=window,
                    fail_on_corrupt=True)
    (images, _), = list(loader)
    return images[0, 0].double().numpy()


class DicomWindowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cohort-dicom-windows-test-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def check(self, path, windows, what):
        """`path` decoded by Cohort and by pydicom under each window; returns how many pixels
        lay strictly inside the windows."""
        folder = os.path.join(self.tmp, "set")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.join(folder, "a"))
        shutil.copy(path, os.path.join(folder, "a", "image.dcm"))
        ds = pydicom.dcmread(path)
        inside = 0
        for window in windows:
            want = expected(ds, window)
            got = decoded(folder, ds.Columns, window)
            self.assertEqual(got.shape, want.shape, what)
            err = np.abs(got - want)
            worst = int(err.argmax())
            self.assertLessEqual(
                err.max(), TOLERANCE,
                f"{what}, window {window or 'of the file'}: pixel {worst} is {got.flat[worst]:.6f}, "
                f"pydicom says {want.flat[worst]:.6f}")
            inside += int(((want > 0) & (want < 1)).sum())
        return inside

    def test_every_bit_depth_and_representation_agrees_with_pydicom(self):
        cases = 0
        for allocated, stored in ((8, 8), (16, 12), (16, 16), (32, 32)):
            for signed in (False, True):
                for kind in ("plain", "rescaled", "dose"):
                    if kind == "dose" and allocated == 8:
                        continue  # RT Dose grids have 16 or 32 bits
                    values, around = stored_values(stored, signed)
                    slope = {"plain": 1.0, "rescaled": 2.5e-4 if allocated == 32 else 0.75,
                             "dose": 3.0e-8 if allocated == 32 else 1.5e-3}[kind]
                    intercept = -1024.5 if kind == "rescaled" else 0.0
                    ends = sorted([values.min() * slope + intercept,
                                   values.max() * slope + intercept])
                    span = ends[1] - ends[0]
                    windows = [None, (ends[0] + 0.3 * span, 0.4 * span),
                               (around * slope + intercept, 200 * slope)]
                    if kind == "dose":
                        windows.append((ends[0] + 0.45 * span, 0.8))  # under 1 Gy
                    for syntax in ("little endian", "big endian", "RLE"):
                        if syntax == "RLE" and allocated == 32:
                            continue  # pydicom encodes RLE up to 16 bits (its files below)
                        what = f"{stored}/{allocated} {'signed' if signed else 'unsigned'} " \
                               f"{kind}, {syntax}"
                        path = os.path.join(self.tmp, "case.dcm")
                        write(path, values, allocated, stored, signed, kind, syntax)
                        self.assertGreater(self.check(path, windows, what), 50, what)
                        cases += 1
        self.assertEqual(cases, 2 * 2 * 3 + 2 * 3 * 3 + 2 * 3 * 3 + 2 * 3 * 2)

    def test_pydicoms_own_rt_dose_files_agree(self):
        files = sorted(glob.glob(os.path.join(PYDICOM_FILES, "rtdose*.dcm")))
        self.assertEqual(len(files), 6, f"pydicom's RT Dose test files in {PYDICOM_FILES}")
        for path in files:
            ds = pydicom.dcmread(path)
            self.assertEqual(ds.BitsAllocated, 32)
            frame = ds.pixel_array[0] if getattr(ds, "NumberOfFrames", 1) > 1 else ds.pixel_array
            gy = frame * float(ds.DoseGridScaling)
            lo, hi = float(gy.min()), float(gy.max())  # 0.795 .. 1.254 Gy
            windows = [(1.0, 0.3), ((lo + hi) / 2, hi - lo), (lo + 0.1, 0.05), (1.0, 2.0)]
            self.assertGreater(self.check(path, windows, os.path.basename(path)), 20, path)


if __name__ == "__main__":
    unittest.main()
