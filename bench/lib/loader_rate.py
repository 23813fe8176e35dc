"""Images per second of a PyTorch DataLoader over `batches` batches after `warm` warm-up
batches, going round its epochs as often as needed (shared by the loader peers)."""
import time


def loader_rate(loader, batches, warm=3):
    seen, done, t0 = 0, 0, None
    while done < batches + warm:
        for images, _ in loader:
            done += 1
            if done == warm:
                t0 = time.perf_counter()
            elif done > warm:
                seen += images.shape[0]
            if done >= batches + warm:
                break
    return seen / (time.perf_counter() - t0), seen
